"""The default model's linear layers in fp32 on the CPU, by kernel, rows and threads: what a
forward pass of ES Lab's CPU engine costs in its linear layers where the CPU has no bf16
matmul hardware (engine/backends/vllm/cpu/weights.py, `_linear_in_fp32`).

    .venv/bin/python bench/cpu_linear.py [--threads 1 2] [--rows 1 4 8 16 64]
                                         [--march native] [--model DIR]

Every linear layer as vLLM serves it (q, k, v fused, gate and up fused, and the vocabulary
projection), one after the other, as a forward pass reads them (the fastest of 5 passes):

- `MKL, padded`: torch.nn.functional.linear on fp32 copies of the weights, the rows padded to
  16 (BATCH_INVARIANT_ROWS): the path without the C kernel;
- `MKL, K x N`: torch.mm against transposed contiguous fp32 copies, padded the same way;
- `oneDNN packed`: fp32 weights prepacked by oneDNN (torch.ops.mkldnn._reorder_linear_weight,
  multiplied by _linear_pointwise), not padded (it passes the check below where measured);
- `bf16`: torch.nn.functional.linear in bf16 (emulated, where the CPU has no bf16 hardware);
- `kernel`: cpu/linear_bf16.c on the bf16 weights, not padded, built with -march=MARCH.

It also times what keeping fp32 copies costs after a write of the weights (a copy from bf16
into every fp32 copy, as Fp32Weights refreshes them, and a oneDNN reorder of every weight),
and checks which products give a row the same bits alone as in a batch of 20 rows (1-20 rows,
unpadded). To see MKL's and oneDNN's AVX2 code on an AVX-512 machine, run it under
MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 with --march haswell.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import sys
from collections.abc import Callable

from model_costs import best_seconds, linear_shapes, print_markdown_table

PADDED = 16


def kernel(march: str) -> Callable[..., object]:
    """linear_bf16.c built with -march=MARCH, as a function of (x, weight) bf16 tensors."""
    import torch

    from engine.backends.vllm.cpu import native
    from engine.backends.vllm.cpu import weights as cpu_weights

    flags = tuple(f"-march={march}" if f == "-march=native" else f for f in native.FLAGS)
    library = native.library(cpu_weights.LINEAR_SOURCE, flags, "fp32 linear layer")
    if library is None:
        raise SystemExit("linear_bf16.c did not build here")
    function = library.eslab_linear_bf16
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    function.argtypes += [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4

    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        (m, k), n = x.shape, weight.shape[0]
        out = torch.empty(m, n, dtype=torch.bfloat16)
        function(x.data_ptr(), k, weight.data_ptr(), k, None, out.data_ptr(), n, m, n, k)
        return out

    return linear


def products(march: str) -> dict[str, tuple[Callable, Callable, bool]]:
    """name: (weight from a bf16 weight, product of rows and that weight, whether its rows
    are padded to 16)."""
    import torch

    f = torch.nn.functional
    return {
        "MKL, padded": (lambda w: w.float(), lambda x, w: f.linear(x.float(), w), True),
        "MKL, K x N": (lambda w: w.float().t().contiguous(), lambda x, w: x.float() @ w, True),
        "oneDNN packed": (
            lambda w: torch.ops.mkldnn._reorder_linear_weight(w.float(), PADDED),
            lambda x, w: torch.ops.mkldnn._linear_pointwise(x.float(), w, None, "none", [], ""),
            False,
        ),
        "bf16": (lambda w: w, f.linear, False),
        "kernel": (lambda w: w, kernel(march), False),
    }


def padded(x, to: int):
    import torch

    return x if x.shape[0] >= to else torch.cat([x, x.new_zeros(to - x.shape[0], x.shape[1])])


def batch_invariant(weight_of: Callable, product: Callable) -> bool:
    """Whether rows 0..m-1 alone (m = 1..20, unpadded) give the bits they give in 20 rows."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 576, generator=g).bfloat16()
    weight = weight_of(torch.randn(1536, 576, generator=g).bfloat16())
    whole = product(x, weight)
    return all(torch.equal(product(x[:m], weight), whole[:m]) for m in range(1, 21))


def main() -> None:
    import torch

    from engine.backends.vllm.cpu.resources import cpu_model
    from engine.paths import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_dir()))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 64])
    parser.add_argument("--march", default="native", help="the kernel's -march (default native)")
    args = parser.parse_args()
    print("command: " + shlex.join([sys.executable, *sys.argv]), flush=True)
    env = {k: v for k, v in os.environ.items() if k.startswith(("MKL_", "ONEDNN_", "OMP_"))}
    print(f"cpu: {cpu_model()}; env: {env or 'none'}; torch {torch.__version__}", flush=True)
    shapes, _ = linear_shapes(args.model)
    g = torch.Generator().manual_seed(0)
    bf16 = [(torch.randn(n, k, generator=g) * 0.05).bfloat16() for n, k in shapes]
    table = products(args.march)
    header = ["threads", "rows", *(f"{name} (ms)" for name in table), "kernel vs MKL"]
    lines = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, (weight_of, _, _) in table.items():
            seconds = best_seconds(lambda w=weight_of: [w(b) for b in bf16], repeats=3)
            print(f"{threads} threads: {name} weights from bf16 {seconds * 1e3:.1f} ms", flush=True)
        for rows in args.rows:
            timed = {}
            for name, (weight_of, product, pad) in table.items():
                held = [weight_of(w) for w in bf16]
                inputs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes}
                if pad:
                    inputs = {k: padded(x, PADDED) for k, x in inputs.items()}

                def forward(held=held, inputs=inputs, product=product) -> None:
                    for (_, k), weight in zip(shapes, held, strict=True):
                        product(inputs[k], weight)

                timed[name] = best_seconds(forward)
                del held
            print(
                f"{threads} threads, {rows} rows: "
                + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in timed.items()),
                flush=True,
            )
            lines.append(
                [
                    str(threads),
                    str(rows),
                    *(f"{s * 1e3:.1f}" for s in timed.values()),
                    f"{timed['MKL, padded'] / timed['kernel']:.2f}x",
                ]
            )
    torch.set_num_threads(args.threads[0])
    for name, (weight_of, product, _) in table.items():
        print(f"{name}: rows 1-20 alone as in a batch of 20: {batch_invariant(weight_of, product)}")
    print_markdown_table(header, lines)


if __name__ == "__main__":
    main()
