"""ES Lab's multi-LoRA linear kernels against vLLM's, per layer, as a decode step runs them.

    python3 bench/gpu/lora_kernels.py MODEL_DIR [MODEL_DIR ...] [--adapters 32]
        [--tokens 256 2048] [--repeats 50] [--json FILE]

For every LoRA-wrapped linear layer of each model (q/k/v fused, o, gate/up fused, down;
bench/gpu/lora_kernel_tune.py's shapes) and every token count (a decode step of population 32
with 8 prompts a member is 256 tokens, 8 an adapter), one layer's LoRA term is computed both
ways on the same inputs and metadata (vLLM's LoRAKernelMeta for the batch):

- `vllm`: vLLM 0.26's `lora_shrink` then `lora_expand`, with the configurations that
  `lora_kernels: deterministic` gives it on this card (engine/backends/vllm/cuda/lora_configs.py);
- `eslab`: engine/backends/vllm/cuda/lora_kernels.lora_linear.

Each is captured `--repeats` times into one CUDA graph and the graph replayed, so the time is
the GPU's, without Python's launch cost (which a decode step's CUDA graph does not pay either);
the median of 5 replays, divided by the repeats, is a layer's time. Prints both per layer and
per decode step (a layer's four calls times the model's layers), their ratio, and the largest
difference of the two results against the result's scale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

from lora_kernel_tune import Shape, lora_shapes, token_mapping  # noqa: E402

from engine.backends.vllm.cpu.resources import model_config  # noqa: E402

RANK_SLOTS = 8
"""The slots' rank: vLLM's max_lora_rank for ES Lab's default rank 4."""
USED = 4


def graph_ms(call, repeats: int) -> float:
    """GPU milliseconds of one call, from a CUDA graph of `repeats` calls (median of 5)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            call()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return statistics.median(times)


def one_layer(shape: Shape, tokens: int, adapters: int, repeats: int) -> dict:
    """Both kernels' times and their results' difference for one layer and batch."""
    import torch
    from vllm.lora.ops.triton_ops import lora_expand, lora_shrink
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    from engine.backends.vllm.cuda import lora_kernels

    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    bf16 = torch.bfloat16

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device=device).to(bf16)

    slices = len(shape.out_slices)
    lora_a = [
        torch.zeros(adapters, 1, RANK_SLOTS, shape.in_features, dtype=bf16, device=device)
        for _ in range(slices)
    ]
    lora_b = [
        torch.zeros(adapters, 1, n, RANK_SLOTS, dtype=bf16, device=device) for n in shape.out_slices
    ]
    for a, b in zip(lora_a, lora_b, strict=True):
        a[:, :, :USED] = normal(adapters, 1, USED, shape.in_features) * 0.05
        b[..., :USED] = normal(*b.shape[:-1], USED) * 0.05
    x = normal(tokens, shape.in_features)
    y0 = normal(tokens, sum(shape.out_slices))
    meta = LoRAKernelMeta.make(adapters, tokens, device)
    meta.prepare_tensors(torch.tensor(token_mapping(tokens, adapters), device=device))
    args = meta.meta_args(tokens, False)
    _, sorted_tokens, per_lora, start, lora_ids, _, active = args
    buffer = torch.empty((slices, tokens, RANK_SLOTS), dtype=torch.float32, device=device)
    theirs, ours = y0.clone(), y0.clone()

    def vllm_call() -> None:
        lora_shrink(x, lora_a, buffer, *args, 1.0)
        lora_expand(buffer, lora_b, theirs, *args, offset_start=0, add_inputs=True)

    def eslab_call() -> None:
        lora_kernels.lora_linear(
            ours, x, lora_a, lora_b, 1.0, shape.out_slices, True, sorted_tokens, per_lora,
            start, lora_ids, int(active.item()),
        )  # fmt: skip

    vllm_call()
    eslab_call()
    torch.cuda.synchronize()
    difference = float((theirs.float() - ours.float()).abs().max())
    scale = float((theirs.float() - y0.float()).abs().max())
    return {
        "layer": shape.name,
        "tokens": tokens,
        "vllm_us": graph_ms(vllm_call, repeats) * 1e3,
        "eslab_us": graph_ms(eslab_call, repeats) * 1e3,
        "max_difference": difference,
        "lora_term_scale": scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--adapters", type=int, default=32)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from engine.backends.vllm.cuda.lora_configs import deterministic_lora_configs

    card = torch.cuda.get_device_name(0)
    folder = Path(tempfile.mkdtemp(prefix="eslab-lora-configs-"))
    os.environ["VLLM_TUNED_CONFIG_FOLDER"] = deterministic_lora_configs(folder, card)
    results = []
    for model in args.models:
        layers = int(model_config(model)["num_hidden_layers"])
        print(f"{model}: {layers} layers, {args.adapters} adapters, rank {USED} in {RANK_SLOTS}")
        for tokens in args.tokens:
            rows = [one_layer(s, tokens, args.adapters, args.repeats) for s in lora_shapes(model)]
            for row in rows:
                print(
                    f"  m={tokens:5d} {row['layer']:13s} vLLM {row['vllm_us']:7.1f} us  "
                    f"ES Lab {row['eslab_us']:7.1f} us  ({row['vllm_us'] / row['eslab_us']:.2f}x)"
                    f"  max diff {row['max_difference']:.3g} of {row['lora_term_scale']:.3g}",
                    flush=True,
                )
            forward = {
                side: sum(r[f"{side}_us"] for r in rows) * layers / 1e3
                for side in ("vllm", "eslab")
            }
            print(
                f"  m={tokens:5d} a forward pass: vLLM {forward['vllm']:.3f} ms, "
                f"ES Lab {forward['eslab']:.3f} ms ({forward['vllm'] / forward['eslab']:.2f}x)"
            )
            results.append(
                {"model": model, "layers": layers, "tokens": tokens, "rows": rows,
                 "forward_ms": forward}
            )  # fmt: skip
    if args.json:
        payload = {"card": card, "adapters": args.adapters, "results": results}
        payload["command"] = " ".join(sys.argv)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
