"""Time per ES and LBES iteration on the default model, split by phase, and the efficiency:
the throughput (generated tokens per second) of an iteration against plain generation of the
same batches by the unperturbed model, one call per member as the iteration makes them.

    .venv/bin/python bench/iteration.py [--population 8] [--prompts 8] [--max-tokens 64]

Prints one table per method; figures are means over the measured steps (the first step is a
warm-up and is not counted).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import load_dataset
from engine.paths import data_dir, default_model_dir
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

PHASES = ("generation", "perturb", "restore", "reward", "logprobs", "update")


def run_method(pool: EnginePool, method: str, args: argparse.Namespace, out: str) -> MemorySink:
    options = {
        "method": method,
        "train_file": str(data_dir() / "conciseness" / "train.parquet"),
        "output_dir": out,
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": args.population,
        "data_batch_size": args.prompts,
        "max_steps": args.steps + 1,
        "max_tokens": args.max_tokens,
        "noise_std": 0.002,
        "learning_rate": 4e-5,
    }
    if method == "lbes":
        options |= {"n": 4, "temperature": 1.0, "top_k_rewards": 1, "bottom_k_rewards": 1}
    sink = MemorySink()
    train(RunConfig.from_flat(options), sink, pool=pool)
    return sink


def baseline_seconds(pool: EnginePool, args: argparse.Namespace, method: str) -> tuple[float, int]:
    """The same work on the unperturbed model: for ES one generation call of the batch per
    member; for LBES the base generation plus one log-likelihood pass per member over two
    samples a prompt (what top_k_rewards=1 + bottom_k_rewards=1 keep)."""
    prompts = [e.prompt for e in load_dataset(data_dir() / "conciseness" / "train.parquet")]
    batch = prompts[: args.prompts]
    start, tokens = time.perf_counter(), 0
    if method == "es":
        for _ in range(args.population):
            outputs = pool.generate(batch, n=1, temperature=0.0, max_tokens=args.max_tokens)
            tokens += sum(c.num_tokens for cs in outputs for c in cs)
        return time.perf_counter() - start, tokens
    outputs = pool.generate(batch, n=4, temperature=1.0, max_tokens=args.max_tokens, seed=1)
    tokens = sum(c.num_tokens for cs in outputs for c in cs)
    kept = [(p, cs[j].token_ids) for p, cs in zip(batch, outputs, strict=True) for j in (0, -1)]
    for _ in range(args.population):
        pool.completion_logprobs([p for p, _ in kept], [c for _, c in kept])
    return time.perf_counter() - start, tokens


def report(method: str, sink: MemorySink, baseline: tuple[float, int]) -> None:
    measured = [s.metrics for s in sink.steps[1:]]
    step_s = float(np.mean([m[mk.time_key("step")] for m in measured]))
    tokens = float(np.mean([completion_tokens(s) for s in sink.steps[1:]]))
    base_s, base_tokens = baseline
    print(f"\n{method.upper()}: {len(measured)} measured steps")
    print(f"  iteration time          {step_s:8.2f} s")
    for phase in PHASES:
        key = mk.time_key(phase)
        if key in measured[0]:
            seconds = float(np.mean([m[key] for m in measured]))
            print(f"  {phase:<23} {seconds:8.2f} s  ({seconds / step_s:5.1%})")
    print(f"  generated tokens        {tokens:8.0f}   {tokens / step_s:7.1f} tokens/s")
    print(
        f"  unperturbed, same work  {base_s:8.2f} s  ({base_tokens} tokens, "
        f"{base_tokens / base_s:.1f} tokens/s)"
    )
    # Greedy members stop at different lengths than the base model, so compare throughput
    # (tokens per second), which is what the time would be for the very same tokens.
    efficiency = (tokens / step_s) / (base_tokens / base_s)
    target = " (target >= 0.9)" if method == "es" else ""
    print(f"  efficiency              {efficiency:8.2f}{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--methods", default="es,lbes")
    args = parser.parse_args()

    print(
        f"model {default_model_dir().name}, population {args.population}, "
        f"{args.prompts} prompts a member, {args.max_tokens} tokens"
    )
    pool = EnginePool(str(default_model_dir()), max_model_len=1024, seed=0)
    try:
        for method in args.methods.split(","):
            sink = run_method(pool, method, args, str(data_dir() / "runs" / f"bench-{method}"))
            report(method, sink, baseline_seconds(pool, args, method))
    finally:
        pool.shutdown()


if __name__ == "__main__":
    main()
