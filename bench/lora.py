"""Full-rank against batched population members on the default model: members evaluated per
second and time per ES iteration for each mode and population size, plus the batched modes'
efficiency against pure batched generation by the base model of the same tokens.

    .venv/bin/python bench/lora.py [--populations 8 32 128] [--prompts 4] [--max-tokens 32]
                                   [--steps 1] [--warmup 1] [--rank 4]
                                   [--modes full lora full_batched]
                                   [--baseline-repeats 3] [--kv-cache-gib 2]

Each (mode, population) runs the real trainer for warmup + steps ES steps on the conciseness
task and reports the mean of the measured steps (the batched modes write new members into
the adapter slots every step, so that cost is in every step, warm-up or not). full mode runs
on a plain engine, one generate call per member; lora mode (low-rank members) and
full_batched (full-rank members, each layer adding every member's noise product) on a
multi-LoRA engine (max_loras = the population), one generate call per step.

The baseline of a measured batched step is one batched generate call by a plain engine's
unperturbed model of the very tokens that step generated: the same prompts, and each request
made to generate exactly as many tokens as its member did (ignore_eos, max_tokens = that
count; perturbed members stop at other lengths than the base model would). It is the median
of `--baseline-repeats` calls, made right after the population's batched run (the engines
stay up; every run, and the plain engine, start from the input model), and

    efficiency = baseline seconds / batched iteration seconds    (mean over measured steps)

Comparing tokens per second instead (against the base model's own completions, which run to
max_tokens more often) understates the batched modes: a batched decode step costs nearly as much
with fewer sequences left (measured: 1,565 tokens took 3.6 s, 2,048 tokens 3.7-4.2 s). Both
figures are printed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from baselines import Requests, same_tokens_seconds, timed_generate

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.backends.vllm.engine import VLLMEngine
from engine.config import RunConfig
from engine.paths import data_dir, default_model_dir, resolve_path
from engine.sink import MemorySink
from engine.slot_population import slot_engine_args
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

TRAIN_FILE = resolve_path("data/conciseness/train.parquet")
INPUT_MASTER = "/tmp/eslab-bench-lora/input-master"
BATCHED = ("lora", "full_batched")
"""The modes whose members the engine holds in adapter slots, all in one call a step."""
"""Every run starts from the input model's fp32 master, saved here when an engine starts."""


@dataclass
class Row:
    mode: str
    population: int
    step_times: list[float]  # each measured step
    tokens: float
    generation_s: float
    perturb_s: float
    update_s: float

    @property
    def step_s(self) -> float:
        return float(np.mean(self.step_times))

    @property
    def members_per_s(self) -> float:
        return self.population / self.step_s


def config(args: argparse.Namespace, mode: str, population: int) -> RunConfig:
    options = {
        "method": "es",
        "train_file": str(TRAIN_FILE),
        "output_dir": str(data_dir() / "runs" / "bench-lora" / mode),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": population,
        "antithetic": True,
        "data_batch_size": args.prompts,
        "max_steps": args.warmup + args.steps,
        "max_tokens": args.max_tokens,
        "seed": 0,
        "max_model_len": 1024,
        "max_num_seqs": args.prompts * max(args.populations),
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    if mode == "lora":
        options |= {
            "perturbation": "lora",
            "lora_rank": args.rank,
            "noise_std": 0.02,
            "learning_rate": 3e-3,
        }
    else:
        options |= {"perturbation": mode, "noise_std": 0.002, "learning_rate": 4e-5}
    return RunConfig.from_flat(options)


def start(
    cfg: RunConfig, max_loras: int | None, args: argparse.Namespace
) -> tuple[EnginePool, VLLMEngine]:
    """An engine (multi-LoRA with max_loras slots) whose KV cache has a fixed size: vLLM CPU
    otherwise sizes it as the memory share minus what this process already holds, which
    with a first engine up is less than nothing."""
    m = cfg.model
    extra = {"kv_cache_memory_bytes": int(args.kv_cache_gib * 2**30)}
    if max_loras:
        extra |= slot_engine_args(cfg.with_overrides([f"population_size={max_loras}"]))
    engine = VLLMEngine(
        str(default_model_dir()),
        max_model_len=m.max_model_len,
        max_num_seqs=m.max_num_seqs,
        gpu_memory_utilization=m.gpu_memory_utilization,
        seed=0,
        extra_llm_args=extra,
    )
    return EnginePool.wrap(engine), engine


def measure(
    pool: EnginePool, cfg: RunConfig, mode: str, args: argparse.Namespace, input_master: str
) -> tuple[Row, list[Requests]]:
    """The mean of the measured steps, and (batched modes) what each measured step generated.
    The run starts from the input model (`input_master`), whatever ran on the engine before."""
    pool.load_master(input_master)
    generated: list[Requests] = []
    generate = pool.generate

    def recording(prompts: Any, *rest: Any, **options: Any) -> Any:
        outputs = generate(prompts, *rest, **options)
        if options.get("adapters") is not None:  # a batched step's members, n = 1
            generated.append(Requests(list(prompts), [cs[0].num_tokens for cs in outputs]))
        return outputs

    pool.generate = recording  # type: ignore[method-assign]
    sink = MemorySink()
    try:
        train(cfg, sink, pool=pool)
    finally:
        del pool.generate  # the method again
    reports = sink.steps[args.warmup :]
    steps = [s.metrics for s in reports]

    def mean(key: str) -> float:
        return float(np.mean([s.get(key, 0.0) for s in steps]))

    row = Row(
        mode,
        cfg.es.population_size,
        [s[mk.time_key("step")] for s in steps],
        float(np.mean([completion_tokens(r) for r in reports])),
        mean(mk.time_key("generation")),
        mean(mk.time_key("perturb")),
        mean(mk.time_key("update")),
    )
    return row, generated[args.warmup :]


def own_tokens_baseline(
    engine: VLLMEngine, step: Requests, args: argparse.Namespace
) -> tuple[float, int]:
    """(seconds, tokens) of the base model's own greedy completions of the same prompts."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens)] * len(step.prompts)
    seconds, lengths = timed_generate(engine, step.prompts, params, args.baseline_repeats)
    return seconds, sum(lengths)


@dataclass
class Baseline:
    """Per measured lora step: seconds for the same tokens, and the base model's own
    completions of its prompts (seconds, tokens)."""

    same_s: list[float]
    own: list[tuple[float, int]]

    def efficiency(self, row: Row) -> float:
        return float(np.mean([b / s for b, s in zip(self.same_s, row.step_times, strict=True)]))

    def throughput_ratio(self, row: Row) -> float:
        own_rate = np.mean([tokens / s for s, tokens in self.own])
        return float(row.tokens / row.step_s / own_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--prompts", type=int, default=4, help="prompts a member")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps before them")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", *BATCHED])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.12)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument(
        "--baseline-repeats",
        type=int,
        default=3,
        help="batched base-model calls a baseline; the median counts",
    )
    args = parser.parse_args()
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)

    rows: dict[tuple[str, int], Row] = {}
    bases: dict[tuple[str, int], Baseline] = {}
    first = config(args, "full", args.populations[0])
    plain, engine = start(first, None, args)  # the baselines, then full mode
    plain.save_master(INPUT_MASTER)
    # Every engine stays up to the end: each baseline is measured right after its batched
    # run, and shutting one engine down tears down vLLM's process-wide parallel state the
    # others still use.
    pools = {
        mode: start(config(args, mode, args.populations[0]), max(args.populations), args)[0]
        for mode in BATCHED
        if mode in args.modes
    }
    try:
        for mode, pool in pools.items():
            for population in args.populations:
                row, steps = measure(pool, config(args, mode, population), mode, args, INPUT_MASTER)
                rows[mode, population] = row
                print(row, flush=True)
                bases[mode, population] = Baseline(  # the plain engine is still the input model
                    [same_tokens_seconds(engine, step, args.baseline_repeats) for step in steps],
                    [own_tokens_baseline(engine, step, args) for step in steps],
                )
                print(f"baseline {mode} N={population}: {bases[mode, population]}", flush=True)
        for population in args.populations if "full" in args.modes else ():
            rows["full", population], _ = measure(
                plain, config(args, "full", population), "full", args, INPUT_MASTER
            )
            print(rows["full", population], flush=True)
    finally:
        for pool in pools.values():
            pool.shutdown()
        plain.shutdown()
    report(args, rows, bases)


def report(
    args: argparse.Namespace,
    rows: dict[tuple[str, int], Row],
    bases: dict[tuple[str, int], Baseline],
) -> None:
    print(
        f"\nmodel {default_model_dir().name}, {args.prompts} prompts a member, "
        f"{args.max_tokens} tokens, rank {args.rank}, {args.steps} measured step(s)"
    )
    print(
        f"{'mode':<13}{'N':>5}{'iter s':>9}{'members/s':>11}{'gen s':>8}{'perturb s':>11}"
        f"{'update s':>10}{'tokens/s':>10}{'x full':>8}{'efficiency':>12}"
        f"{'tok/s ratio':>13}"
    )
    for (mode, population), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        speedup = efficiency = ratio = ""
        full = rows.get(("full", population))
        if mode != "full" and full is not None:
            speedup = f"{row.members_per_s / full.members_per_s:.2f}x"
        if (mode, population) in bases:
            efficiency = f"{bases[mode, population].efficiency(row):.2f}"
            ratio = f"{bases[mode, population].throughput_ratio(row):.2f}"
        print(
            f"{mode:<13}{population:>5}{row.step_s:>9.2f}{row.members_per_s:>11.2f}"
            f"{row.generation_s:>8.2f}{row.perturb_s:>11.2f}{row.update_s:>10.2f}"
            f"{row.tokens / row.step_s:>10.1f}{speedup:>8}{efficiency:>12}{ratio:>13}"
        )
    for (mode, population), base in sorted(bases.items()):
        same = ", ".join(f"{s:.2f}" for s in base.same_s)
        own = ", ".join(f"{s:.2f} s for {t}" for s, t in base.own)
        print(
            f"base model for {mode} N={population}: same tokens {same} s; "
            f"own completions {own} tokens"
        )
    print(
        "efficiency: base model's batched generation of the same tokens / batched iteration; "
        "tok/s ratio: batched tokens/s / base model's tokens/s on its own completions"
    )
    print("targets: lora >= 2x the members/s of full at N=32; efficiency >= 0.5")


if __name__ == "__main__":
    main()
