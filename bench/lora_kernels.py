"""The CPU multi-LoRA kernels of one decoder layer of the default model, without an engine.

    .venv/bin/python bench/lora_kernels.py [--adapters 32] [--rank 4] [--max-rank 8]

Times, in milliseconds on one thread (vLLM's CPU backend computes on one), the LoRA term of
the four linear layers of a SmolLM2-135M decoder layer (q/k/v 576 -> 576+192+192, o 576 ->
576, gate/up 576 -> 2x1536, down 1536 -> 576) for a decode step (4 tokens an adapter, in
member order), a ragged decode step (3 or 4 tokens an adapter: some sequences finished) and
a prefill chunk (150 tokens an adapter), three ways:
- per slice: a shrink and an expand per slice through the grouped kernels (`bgmv_shrink`,
  `bgmv_expand_slice`), what vLLM's punica wrapper calls when add_lora_linear is not replaced;
- fused, torch: `cpu_lora.add_lora_linear` without the per-token C kernel (a machine without
  a compiler);
- fused: `cpu_lora.add_lora_linear`, as installed into vLLM (decode tokens go to the kernel).
Adapters have rank `--rank` in slots of vLLM's rank `--max-rank` (rank 4 is served in rank-8
slots), so the fused kernel's rank trimming shows.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable

import torch

from engine.backends.vllm.cpu import lora_kernels as cpu_lora
from engine.backends.vllm.cpu import native as cpu_lora_native

LAYERS = {
    "qkv": (576, (576, 192, 192)),
    "o": (576, (576,)),
    "gate_up": (576, (1536, 1536)),
    "down": (1536, (576,)),
}


def timed(fn: Callable[[], None], repeats: int) -> float:
    """Median milliseconds of `repeats` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def measure_layer(
    args: argparse.Namespace, width: int, slices: tuple[int, ...], rows: list[int]
) -> tuple[int, float, float, float]:
    """(tokens, per-slice ms, fused torch ms, fused ms) of one linear layer, adapter i having
    rows[i % len(rows)] tokens."""
    bf16, n = torch.bfloat16, args.adapters
    a = tuple(torch.zeros(n, 1, args.max_rank, width, dtype=bf16) for _ in slices)
    b = tuple(torch.zeros(n, 1, size, args.max_rank, dtype=bf16) for size in slices)
    for w in a:
        w[:, :, : args.rank].normal_()
    for w in b:
        w[..., : args.rank].normal_()
    indices = torch.arange(n).repeat_interleave(torch.tensor(rows).repeat(n)[:n])
    x = torch.randn(indices.numel(), width, dtype=bf16)
    y = torch.zeros(indices.numel(), sum(slices), dtype=bf16)
    wrapper = type("Wrapper", (), {"token_lora_indices": indices})()

    def fused(kernel: Callable[[], object]) -> float:
        cpu_lora_native.kernel, cpu_lora._last_plan = kernel, None
        return timed(
            lambda: cpu_lora.add_lora_linear(wrapper, y, x, a, b, 1.0, slices), args.repeats
        )

    built = cpu_lora_native.kernel
    try:
        return (
            indices.numel(),
            timed(lambda: per_slice(x, y, a, b, indices, slices), args.repeats),
            fused(lambda: None),
            fused(built),
        )
    finally:
        cpu_lora_native.kernel = built


def per_slice(x, y, a, b, indices, slices) -> None:
    offset = 0
    for a_s, b_s, size in zip(a, b, slices, strict=True):
        shrunk = torch.zeros(x.shape[0], a_s.shape[2])
        cpu_lora.bgmv_shrink(x, a_s, shrunk, indices, 1.0)
        cpu_lora.bgmv_expand_slice(shrunk, b_s, y, indices, offset, size, True)
        offset += size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--max-rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)
    torch.set_num_threads(1)
    print(f"{args.adapters} adapters of rank {args.rank} in rank-{args.max_rank} slots, ms")
    if cpu_lora_native.kernel() is None:
        sys.exit("the per-token kernel did not build (see the warning above)")
    print(f"{'case':<9}{'layer':<9}{'tokens':>7}{'per slice':>11}{'fused, torch':>14}{'fused':>8}")
    for case, rows in (("decode", [4]), ("ragged", [4, 3, 4, 4, 3]), ("prefill", [150])):
        totals = [0.0, 0.0, 0.0]
        for name, (width, slices) in LAYERS.items():
            tokens, *ms = measure_layer(args, width, slices, rows)
            totals = [t + m for t, m in zip(totals, ms, strict=True)]
            print(f"{case:<9}{name:<9}{tokens:>7}{ms[0]:>11.2f}{ms[1]:>14.2f}{ms[2]:>8.2f}")
        print(f"{case:<9}{'layer':<9}{'':>7}{totals[0]:>11.2f}{totals[1]:>14.2f}{totals[2]:>8.2f}")


if __name__ == "__main__":
    main()
