"""Tune vLLM's multi-LoRA shrink and expand Triton kernels for the low-rank mode's shapes on
this card, keeping what makes them deterministic (shrink without split-K), and write the
configuration files that vLLM reads from VLLM_TUNED_CONFIG_FOLDER.

    python3 bench/gpu/lora_kernel_tune.py MODEL_DIR [MODEL_DIR ...] --out FOLDER
        [--rank 4] [--adapters 32] [--tokens 64 256 1024 4096]

With FOLDER engine/backends/vllm/cuda/tuned_lora, `lora_kernels: deterministic` gives vLLM
these files on this kind of card from then on (engine/backends/vllm/cuda/lora_configs.py).

Why: profiled on an H200 (bench/gpu/profile_step.py, 1.07B model, 32 members of 8 prompts),
the two kernels took 1.21 s of the step's 1.55 s of GPU time, each call 40-60 us for work
of a few microseconds' worth of memory traffic, with vLLM 0.26's default blocks (shrink
loops over the whole hidden size in steps of 32 once split-K is off; expand runs at 13%
occupancy).

For every model's LoRA shapes (q/k/v fused: 3 slices, o: 1, gate/up: 2, down: 1) and every
token count (a decode step of the population is adapters x prompts tokens), each candidate
configuration is timed with triton.testing.do_bench (median) on `adapters` adapters of
`rank`, every adapter's tokens together as a member's sequences are, and its output
checked against vLLM's default configuration's. Prints a line per shape (default ms, best
ms, best configuration) and writes FOLDER/<card>_SHRINK.json, FOLDER/<card>_EXPAND_TRUE.json
and _FALSE.json (vLLM's layout: max_loras -> slices -> m -> k -> n -> configuration) and
FOLDER/lora-kernel-tune.json (every shape's default and best times), after every shape; the
same command run again continues where a cut-short run stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.backends.vllm.cpu.resources import model_config  # noqa: E402
from engine.backends.vllm.cuda.lora_configs import card_file_name  # noqa: E402

SHRINK_SPACE = {
    "block_m": (16, 32, 64),
    "block_n": (16,),
    "block_k": (64, 128, 256, 512),
    "num_warps": (4, 8),
    "num_stages": (1, 2),
}
"""Shrink candidates; split_k stays 1 (a split sums in an order that varies run to run)."""
EXPAND_SPACE = {
    "block_m": (16, 32, 64),
    "block_n": (32, 64, 128, 256),
    "block_k": (16,),
    "num_warps": (4, 8),
    "num_stages": (1, 2),
}
"""Expand candidates: its K is the rank (at most 16 here), padded to the dot's 16."""
FIXED = {"num_ctas": 1, "max_nreg": None}
RESULTS_FILE = "lora-kernel-tune.json"


@dataclass(frozen=True)
class Shape:
    """One LoRA-wrapped linear layer: the input width and each slice's output width."""

    name: str
    in_features: int
    out_slices: tuple[int, ...]


def lora_shapes(model_dir: str | Path) -> list[Shape]:
    """The shapes vLLM's LoRA layers of a Llama-family model have at tensor parallel size 1
    (q/k/v and gate/up fused as vLLM fuses them)."""
    config = model_config(model_dir)
    if config is None:
        raise SystemExit(f"{model_dir}: no config.json")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_dim, kv_heads * head_dim
    return [
        Shape("qkv_proj", hidden, (q, kv, kv)),
        Shape("o_proj", q, (hidden,)),
        Shape("gate_up_proj", hidden, (inter, inter)),
        Shape("down_proj", inter, (hidden,)),
    ]


def candidates(space: dict[str, tuple], op: str) -> Iterator[dict[str, Any]]:
    extra = {"split_k": 1, "group_size_m": 8} if op == "shrink" else {}
    for values in itertools.product(*space.values()):
        yield {**dict(zip(space, values, strict=True)), **extra, **FIXED}


def token_mapping(tokens: int, adapters: int) -> list[int]:
    """Each adapter's tokens side by side (a member's sequences are scheduled together)."""
    return [min(i * adapters // tokens, adapters - 1) for i in range(tokens)]


def nest(entries: dict[tuple[int, int, int, int, int], dict]) -> dict:
    """{(max_loras, slices, m, k, n): config} in vLLM's nested JSON layout, keys as text."""
    out: dict = {}
    for (loras, slices, m, k, n), config in sorted(entries.items()):
        level = out
        for key in (loras, slices, m, k):
            level = level.setdefault(str(key), {})
        level[str(n)] = config
    return out


class Bench:
    """vLLM's two kernels on one card, with a configuration chosen per call."""

    def __init__(self, rank: int, adapters: int) -> None:
        import torch
        from vllm.lora.ops.triton_ops import lora_expand_op, lora_shrink_op
        from vllm.lora.ops.triton_ops import utils as lora_utils
        from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

        self.torch, self.rank, self.adapters = torch, rank, adapters
        self.modules = {"shrink": lora_shrink_op, "expand": lora_expand_op}
        self.utils = lora_utils
        self._vllm_default = lora_utils.get_lora_op_configs.__wrapped__  # uncached
        self.meta_class = LoRAKernelMeta

    def baseline(self, op: str, key: tuple[int, ...]) -> dict:
        """What `lora_kernels: deterministic` gives vLLM today for a call of `key`: its
        default configuration, shrink without split-K
        (engine/backends/vllm/cuda/lora_configs.py)."""
        loras, slices, m, k, n = key
        width = k if op == "shrink" else n
        config = dict(self._vllm_default(op, loras, m, width, self.rank, slices))
        return {**config, "split_k": 1} if op == "shrink" else config

    def run(
        self, op: str, shape: Shape, tokens: int, config: dict | None
    ) -> tuple[float, Any, tuple[int, ...]]:
        """(median ms, output, vLLM's key of the call) of one op with `config` (None: the
        baseline)."""
        import triton

        torch, module = self.torch, self.modules[op]
        device = torch.device("cuda")
        # vLLM caches the weights' pointers and strides by address: a freed tensor's address
        # may come back with another shape
        self.utils._LORA_A_PTR_DICT.clear()
        self.utils._LORA_B_PTR_DICT.clear()
        meta = self.meta_class.make(self.adapters, tokens, device)
        meta.prepare_tensors(torch.tensor(token_mapping(tokens, self.adapters), device=device))
        args = meta.meta_args(tokens, False)
        slices = len(shape.out_slices)
        torch.manual_seed(0)
        bf16 = torch.bfloat16
        if op == "shrink":
            x = torch.randn(tokens, shape.in_features, dtype=bf16, device=device)
            a_shape = (self.adapters, 1, self.rank, shape.in_features)
            weights = [torch.randn(a_shape, dtype=bf16, device=device) for _ in range(slices)]
            out = torch.zeros(slices, tokens, self.rank, dtype=torch.float32, device=device)
            call = lambda: module._lora_shrink(x, weights, out, *args, 1.0)  # noqa: E731
            key = (self.adapters + 1, slices, tokens, shape.in_features, self.rank)
        else:
            x = torch.randn(slices, tokens, self.rank, dtype=torch.float32, device=device)
            weights = [
                torch.randn(self.adapters, 1, n, self.rank, dtype=bf16, device=device)
                for n in shape.out_slices
            ]
            out = torch.zeros(tokens, sum(shape.out_slices), dtype=bf16, device=device)
            call = lambda: module._lora_expand(x, weights, out, *args, 0, True)  # noqa: E731
            key = (self.adapters + 1, slices, tokens, self.rank, max(shape.out_slices))
        chosen = config or self.baseline(op, key)
        original = module.get_lora_op_configs
        module.get_lora_op_configs = lambda *a, **k: chosen
        try:
            out.zero_()
            call()
            result = out.clone()
            ms = triton.testing.do_bench(call, warmup=5, rep=25, return_mode="median")
        finally:
            module.get_lora_op_configs = original
        return ms, result, key


def tune(
    bench: Bench, op: str, shape: Shape, tokens: int, space: dict, log: Callable[[str], None]
) -> dict:
    """The fastest candidate of `space` whose output matches the baseline's, and both
    times (`config` None: no candidate beat the baseline)."""
    torch = bench.torch
    default_ms, expected, key = bench.run(op, shape, tokens, None)
    best_ms, best = default_ms, None
    for config in candidates(space, op):
        try:
            ms, result, _ = bench.run(op, shape, tokens, config)
        except Exception as exc:  # a configuration the kernel cannot compile (resources)
            log(f"    skipped {config}: {type(exc).__name__}")
            continue
        # expand accumulates into its output: the first call's sum, as the default's
        if not torch.allclose(result.float(), expected.float(), rtol=2e-2, atol=1e-1):
            log(f"    rejected {config}: output differs from the default's")
            continue
        if ms < best_ms:
            best_ms, best = ms, config
    log(
        f"{op:6s} {shape.name:13s} m={tokens:5d}: default {default_ms * 1e3:7.1f} us, "
        f"best {best_ms * 1e3:7.1f} us ({default_ms / best_ms:.1f}x) {best or 'default'}"
    )
    return {"key": key, "default_ms": default_ms, "best_ms": best_ms, "config": best}


def print_now(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--adapters", type=int, default=32)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024, 4096])
    args = parser.parse_args()

    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    card = card_file_name(torch.cuda.get_device_name())
    bench = Bench(args.rank, args.adapters)
    results = earlier_results(args.out)
    tuned: dict[str, dict] = {"shrink": {}, "expand": {}}
    for found in results:
        key = tuple(found["key"])
        tuned[found["op"]][key] = found["config"] or bench.baseline(found["op"], key)
    done = {(r["model"], r["op"], r["shape"], r["key"][2]) for r in results}
    for model in args.models:
        print_now(f"{model}: rank {args.rank}, {args.adapters} adapters")
        for shape, tokens in itertools.product(lora_shapes(model), args.tokens):
            for op, space in (("shrink", SHRINK_SPACE), ("expand", EXPAND_SPACE)):
                if (model, op, shape.name, tokens) in done:
                    continue
                found = tune(bench, op, shape, tokens, space, print_now)
                results.append({"model": model, "op": op, "shape": shape.name, **found})
                key = tuple(found["key"])
                tuned[op][key] = found["config"] or bench.baseline(op, key)
            write(args.out, card, tuned, results)  # a run cut short keeps what it tuned
    print(f"wrote {card}_SHRINK.json, {card}_EXPAND_TRUE.json, _FALSE.json in {args.out}")


def earlier_results(out: Path) -> list[dict]:
    """What an earlier run into `out` tuned (a run cut short by a machine's time limit is
    continued by the same command, not begun again)."""
    path = out / RESULTS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def write(out: Path, card: str, tuned: dict[str, dict], results: list[dict]) -> None:
    """The configuration files as vLLM reads them, and every shape's times."""
    (out / f"{card}_SHRINK.json").write_text(json.dumps(nest(tuned["shrink"]), indent=1))
    expand = json.dumps(nest(tuned["expand"]), indent=1)
    for add in ("TRUE", "FALSE"):
        (out / f"{card}_EXPAND_{add}.json").write_text(expand)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
