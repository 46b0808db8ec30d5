"""A member's perturbation of packed weights (AMX CPUs) against the plain one and a copy.

    .venv/bin/python bench/packed_perturb.py [--model DIR] [--repeats 20] [--threads 2]

On AMX CPUs the engine keeps the linear layers' weights packed for vLLM's kernel, and a
member's weights are written as pack(snapshot + scale * eps) (engine/backends/vllm/cpu/
packed.py) so that the noise is the logical tensor's. This times, over the linear layers of
a model (shapes from its config.json; no engine is started, so the figures hold on any CPU
and do not need vLLM's kernels), interleaved round by round so that a busy machine slows
every variant alike, the best of `repeats` rounds of:
- copy: one plain copy of the weights (the yardstick of bench/perturb.py);
- plain: engine.noise.perturb_ on logical weights (what an engine that does not pack does);
- packed C: the C kernel into the packed layout (what an AMX engine does);
- packed torch: the path without a C compiler (perturb_ into a scratch tensor, then packed).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine import noise
from engine.backends.vllm.cpu import packed
from engine.paths import PROJECT_ROOT


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(out, in) of every linear layer of a Llama-family decoder, as vLLM fuses them."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    head_dim = config.get("head_dim") or hidden // heads
    qkv = (heads + 2 * (kv or heads)) * head_dim
    layer = [(qkv, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]
    return layer * config["num_hidden_layers"]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


Variant = Callable[[list[int]], None]


def variants(shapes: list[tuple[int, int]], table: torch.Tensor) -> dict[str, Variant]:
    """Each way of writing one member's weights, as a function of its noise offsets."""
    snapshots = [torch.randn(n, k).mul_(0.05).bfloat16() for n, k in shapes]
    lives = [torch.empty_like(s) for s in snapshots]
    layouts = [packed.PackedLayout(n, k) for n, k in shapes]
    wholes = [noise.whole(n * k) for n, k in shapes]
    rows = [packed.noise_rows(w, s) for w, s in zip(wholes, shapes, strict=True)]
    kernel = packed._kernel()

    def copy(offsets: list[int]) -> None:
        for live, snap in zip(lives, snapshots, strict=True):
            live.copy_(snap)

    def plain(offsets: list[int]) -> None:
        for live, snap, offset, whole in zip(lives, snapshots, offsets, wholes, strict=True):
            noise.perturb_(live, snap, table, offset, 0.002, whole)

    def packed_c(offsets: list[int]) -> None:
        for i, offset in enumerate(offsets):
            packed.perturb_(
                lives[i], snapshots[i], table, offset, 0.002, wholes[i], layouts[i], rows[i]
            )

    def packed_torch(offsets: list[int]) -> None:
        packed._kernel = lambda: None
        try:
            packed_c(offsets)
        finally:
            packed._kernel = lambda: kernel

    out = {"copy": copy, "plain": plain, "packed torch": packed_torch}
    if kernel is not None:
        out["packed C"] = packed_c
    return out


def best_times(
    ways: dict[str, Variant], shapes: list[tuple[int, int]], table: torch.Tensor, repeats: int
) -> dict[str, float]:
    """Best seconds of each variant over `repeats` rounds after a warm-up, interleaved."""
    best = {name: float("inf") for name in ways}
    for round_ in range(repeats + 1):
        offsets = noise.noise_offsets(
            round_, [(str(i), n * k) for i, (n, k) in enumerate(shapes)], table.numel()
        )
        for name, fn in ways.items():
            start = time.perf_counter()
            fn(offsets)
            if round_:
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(PROJECT_ROOT / "data/models/smollm2-135m-instruct"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    shapes = linear_shapes(json.loads((Path(args.model) / "config.json").read_text()))
    table = noise.build_noise_table(noise.noise_table_len(max(n * k for n, k in shapes)))
    best = best_times(variants(shapes, table), shapes, table, args.repeats)
    numel = sum(n * k for n, k in shapes)
    print(
        f"{cpu_name()}, {args.threads} threads; {len(shapes)} linear layers of "
        f"{Path(args.model).name}, {numel / 1e6:.1f}M bf16 entries; best of {args.repeats}"
    )
    print(f"{'variant':<14} {'ms':>8} {'x copy':>8} {'x plain':>8}")
    for name, seconds in best.items():
        print(
            f"{name:<14} {seconds * 1e3:8.2f} {seconds / best['copy']:8.2f} "
            f"{seconds / best['plain']:8.2f}"
        )


if __name__ == "__main__":
    main()
