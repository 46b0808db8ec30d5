"""Full-rank against low-rank (LoRA) population members on the default model: members
evaluated per second and time per ES iteration for each mode and population size, plus lora
mode's efficiency against pure batched generation by the base model.

    .venv/bin/python bench/lora.py [--populations 8 32 128] [--prompts 4] [--max-tokens 32]
                                   [--steps 1] [--warmup 1] [--rank 4] [--modes full lora]
                                   [--baseline-repeats 3]

Each (mode, population) runs the real trainer for warmup + steps ES steps on the conciseness
task and reports the mean of the measured steps (lora mode loads new adapters every step, so
that cost is in every step, warm-up or not). full mode runs on a plain engine, one generate
call per member; lora mode on a multi-LoRA engine (max_loras = the population), one generate
call per step. The baseline is one batched generate call of every member's prompts by the
plain engine's unperturbed model (population x prompts requests). Greedy members stop at
different lengths than the base model, so efficiency compares throughput, which is the
baseline's time for the very same tokens over the lora iteration time:

    efficiency = (lora tokens / lora iteration seconds) / (baseline tokens / baseline seconds)
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass

import numpy as np

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import load_dataset
from engine.lora_population import engine_args
from engine.paths import data_dir, default_model_dir
from engine.sink import MemorySink
from engine.trainer import train

TRAIN_FILE = data_dir() / "conciseness" / "train.parquet"


@dataclass
class Row:
    mode: str
    population: int
    step_s: float
    tokens: float
    generation_s: float
    perturb_s: float
    update_s: float

    @property
    def members_per_s(self) -> float:
        return self.population / self.step_s


def config(args: argparse.Namespace, mode: str, population: int) -> RunConfig:
    options = {
        "method": "es", "train_file": str(TRAIN_FILE),
        "output_dir": f"/tmp/eslab-bench-lora/{mode}",
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": population, "antithetic": True, "data_batch_size": args.prompts,
        "max_steps": args.warmup + args.steps, "max_tokens": args.max_tokens, "seed": 0,
        "max_model_len": 1024, "max_num_seqs": args.prompts * max(args.populations),
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    if mode == "lora":
        options |= {"perturbation": "lora", "lora_rank": args.rank, "noise_std": 0.02,
                    "learning_rate": 3e-3}
    else:
        options |= {"noise_std": 0.002, "learning_rate": 4e-5}
    return RunConfig.from_flat(options)


def start(cfg: RunConfig, max_loras: int | None) -> EnginePool:
    m = cfg.model
    extra = engine_args(cfg.with_overrides([f"population_size={max_loras}"])) if max_loras else None
    return EnginePool(str(default_model_dir()), max_model_len=m.max_model_len,
                      max_num_seqs=m.max_num_seqs, gpu_memory_utilization=m.gpu_memory_utilization,
                      seed=0, extra_llm_args=extra)


def measure(pool: EnginePool, cfg: RunConfig, mode: str, args: argparse.Namespace) -> Row:
    sink = MemorySink()
    train(cfg, sink, pool=pool)
    steps = [s.metrics for s in sink.steps[args.warmup:]]

    def mean(key: str) -> float:
        return float(np.mean([s.get(key, 0.0) for s in steps]))

    return Row(mode, cfg.es.population_size, mean(mk.time_key("step")),
               mean("train/num_tokens"), mean(mk.time_key("generation")),
               mean(mk.time_key("perturb")), mean(mk.time_key("update")))


def baseline(pool: EnginePool, args: argparse.Namespace, population: int) -> tuple[float, int]:
    """(seconds, tokens) of one batched generate call of every member's prompts by the base
    model: the median of `--baseline-repeats` calls (one call varied from 3.0 to 5.1 s at
    N=32 on this machine, which alone moved the efficiency from 0.39 to 0.51)."""
    prompts = [e.prompt for e in load_dataset(TRAIN_FILE)][: args.prompts] * population
    pool.generate(prompts[: args.prompts], max_tokens=4)  # warm-up
    seconds, tokens = [], 0
    for _ in range(args.baseline_repeats):
        start_s = time.perf_counter()
        outputs = pool.generate(prompts, n=1, temperature=0.0, max_tokens=args.max_tokens)
        seconds.append(time.perf_counter() - start_s)
        tokens = sum(c.num_tokens for cs in outputs for c in cs)
    print(f"baseline N={population}: " + ", ".join(f"{s:.2f}" for s in seconds) + " s",
          flush=True)
    return float(np.median(seconds)), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--prompts", type=int, default=4, help="prompts a member")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps before them")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.12)
    parser.add_argument("--baseline-repeats", type=int, default=3,
                        help="batched base-model calls; the median is the baseline")
    args = parser.parse_args()
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)

    rows: dict[tuple[str, int], Row] = {}
    bases: dict[int, tuple[float, int]] = {}
    first = config(args, "full", args.populations[0])
    pool = start(first, None)  # plain engine: full mode and the baseline
    try:
        for population in args.populations:  # on the input model, before any ES step
            bases[population] = baseline(pool, args, population)
        for population in args.populations:
            if "full" in args.modes:
                rows["full", population] = measure(pool, config(args, "full", population), "full",
                                                 args)
                print(rows["full", population], flush=True)
    finally:
        pool.shutdown()
    if "lora" in args.modes:
        pool = start(first, max(args.populations))
        try:
            for population in args.populations:
                rows["lora", population] = measure(pool, config(args, "lora", population), "lora",
                                                 args)
                print(rows["lora", population], flush=True)
        finally:
            pool.shutdown()
    report(args, rows, bases)


def report(args: argparse.Namespace, rows: dict[tuple[str, int], Row],
           bases: dict[int, tuple[float, int]]) -> None:
    print(f"\nmodel {default_model_dir().name}, {args.prompts} prompts a member, "
          f"{args.max_tokens} tokens, rank {args.rank}, {args.steps} measured step(s)")
    print(f"{'mode':<6}{'N':>5}{'iter s':>9}{'members/s':>11}{'gen s':>8}{'perturb s':>11}"
          f"{'update s':>10}{'tokens/s':>10}{'lora/full':>11}{'efficiency':>12}")
    for (mode, population), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        speedup = efficiency = ""
        full = rows.get(("full", population))
        if mode == "lora" and full is not None:
            speedup = f"{row.members_per_s / full.members_per_s:.2f}x"
        if mode == "lora" and population in bases:
            base_s, base_tokens = bases[population]
            efficiency = f"{(row.tokens / row.step_s) / (base_tokens / base_s):.2f}"
        print(f"{mode:<6}{population:>5}{row.step_s:>9.2f}{row.members_per_s:>11.2f}"
              f"{row.generation_s:>8.2f}{row.perturb_s:>11.2f}{row.update_s:>10.2f}"
              f"{row.tokens / row.step_s:>10.1f}{speedup:>11}{efficiency:>12}")
    for population, (seconds, tokens) in sorted(bases.items()):
        print(f"base batched generation N={population}: {seconds:.2f} s, {tokens} tokens, "
              f"{tokens / seconds:.1f} tokens/s")
    print("targets: lora >= 2x the members/s of full at N=32; efficiency >= 0.5")


if __name__ == "__main__":
    main()
