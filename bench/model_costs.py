"""The default model's matrix products measured alone, with torch, as ES Lab's CPU engine
computes them: the floors that bench/generation.py and bench/iteration.py set the engine's
own figures against."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path


def best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of `repeats` timed calls, after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return min(out)


FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"} | {
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
"""Projections vLLM serves as one matrix (QKVParallelLinear, MergedColumnParallelLinear)."""


def linear_shapes(model_dir: str) -> tuple[list[tuple[int, int]], dict]:
    """((rows, columns) of every linear layer as vLLM serves it, the vocabulary projection
    last; the model's config) of a Hugging Face folder of safetensors: every matrix but the
    embeddings, fused as vLLM fuses them."""
    from safetensors import safe_open

    config = json.loads((Path(model_dir) / "config.json").read_text())
    fused: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors file is not iterable)
                shape = f.get_slice(name).get_shape()
                if len(shape) != 2 or "embed_tokens" in name or "lm_head" in name:
                    continue
                prefix, _, leaf = name.removesuffix(".weight").rpartition(".")
                key = f"{prefix}.{FUSED.get(leaf, leaf)}"
                rows, columns = fused.get(key, [0, shape[1]])
                fused[key] = [rows + shape[0], columns]
    shapes = [(rows, columns) for rows, columns in fused.values()]
    return [*shapes, (config["vocab_size"], config["hidden_size"])], config


def linear_seconds(shapes: list[tuple[int, int]], rows: int) -> float:
    """Seconds of torch.nn.functional.linear over each of these bf16 weights on `rows` rows,
    one layer after the other (the weights stream from memory, as in a forward pass)."""
    import torch

    weights = [torch.randn(r, c, dtype=torch.bfloat16) for r, c in shapes]
    inputs = {c: torch.randn(rows, c, dtype=torch.bfloat16) for _, c in shapes}

    def forward() -> None:
        for weight in weights:
            torch.nn.functional.linear(inputs[weight.shape[1]], weight)

    return best_seconds(forward, repeats=3)


def log_softmax_seconds(vocab: tuple[int, int], rows: int) -> float:
    """Seconds of the vocabulary projection of `rows` positions and their log-softmax in
    fp32: what a position's log-probability costs beyond the forward pass (vLLM's
    prompt_logprobs computes this for every position of the prompt)."""
    import torch

    weight = torch.randn(*vocab, dtype=torch.bfloat16)
    hidden = torch.randn(rows, vocab[1], dtype=torch.bfloat16)
    return best_seconds(
        lambda: torch.log_softmax(torch.nn.functional.linear(hidden, weight).float(), -1),
        repeats=3,
    )


def print_markdown_table(header: list[str], rows: list[list[str]]) -> None:
    """The figures as a table to paste into docs/benchmarks.md."""
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
