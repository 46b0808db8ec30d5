"""Time per ES and LBES iteration on the default model, split by phase, and the efficiency of
each against the unperturbed engine doing the very same requests.

    .venv/bin/python bench/iteration.py [--preset es-conciseness] [--steps 2]
                                        [--methods es,lbes] [--engines 1] [--repeats 3]

Both methods run the `--preset` configuration (by default es-conciseness: population 8, 8
prompts a member, 32 tokens, the default model); LBES adds n=4 samples at temperature 1 and
keeps the best and worst sample of each prompt. The first step is a warm-up; figures are
means over the measured steps.

Efficiency (one engine): the seconds the unperturbed engine takes for the very requests a
measured step made, in the same calls (ES: each member's call with every request held to
its member's completion length; LBES: the base generation held to its lengths, plus each
member's log-likelihood call), replayed right after that step, over the step's seconds;
printed for the mean and for each step. What ES adds (perturb, restore, reward, update) is
the difference, so it is at most 1 up to timing noise. For LBES the
log-likelihood phase is also set against plain prefill of the same token ids (one token
generated, no log-probabilities asked): the engine's prefill speed for the same tokens; and
the ceiling of that ratio is printed: exact log-likelihoods need the vocabulary projection
and a log-softmax at every scored position, which plain prefill does not compute (measured
alone with torch, bench/model_costs.py).

With `--engines N` > 1 the members are spread over N engines (Ray actors, disjoint cores);
step times and tokens/s are printed, and the efficiency is not (its baseline is one engine).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import numpy as np
from baselines import Recorder, logprob_seconds, prefill_seconds, same_tokens_seconds
from model_costs import linear_shapes, log_softmax_seconds

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.backends.vllm.cpu.resources import cpu_model
from engine.backends.vllm.engine import VLLMEngine
from engine.config import RunConfig
from engine.paths import data_dir, default_model_dir
from engine.presets import load_preset
from engine.sink import MemorySink, StepReport
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

PHASES = ("generation", "perturb", "restore", "reward", "logprobs", "update")
LBES_OPTIONS = ["method=lbes", "n=4", "temperature=1.0", "top_k_rewards=1", "bottom_k_rewards=1"]


def config(args: argparse.Namespace, method: str) -> RunConfig:
    preset = load_preset(args.preset)
    overrides = [
        f"max_steps={args.steps + 1}",
        "eval_strategy=no",
        "save_strategy=no",
        f"output_dir={data_dir() / 'runs' / f'bench-iteration-{method}'}",
    ]
    return preset.with_overrides(overrides + (LBES_OPTIONS if method == "lbes" else []))


class StepSink(MemorySink):
    """A MemorySink that, whenever the trainer finishes a step after the warm-up, times that
    step's recorded requests on the engine at once (`bases`), then opens the next step in the
    recorder. At once, not after the run: this shared machine's speed drifts by a tenth
    within minutes, which an efficiency of a few percent cannot absorb."""

    def __init__(self, recorder: Recorder | None, repeats: int) -> None:
        super().__init__()
        self.recorder = recorder
        self.repeats = repeats
        self.bases: list[dict[str, float]] = []
        if recorder is not None:
            recorder.start_step()

    def log_step(self, report: StepReport) -> None:
        super().log_step(report)
        if self.recorder is None:
            return
        if len(self.steps) > 1:  # the first step is a warm-up
            with self.recorder.paused() as engine:  # unperturbed between steps
                self.bases.append(baseline_seconds(engine, self.recorder.steps[-1], self.repeats))
        self.recorder.start_step()


def baseline_seconds(engine: VLLMEngine, requests: dict, repeats: int) -> dict[str, float]:
    """The unperturbed engine's seconds for one step's recorded calls, by kind."""
    out = {"generate": 0.0, "logprobs": 0.0, "prefill": 0.0, "logprob_tokens": 0.0}
    out |= {"logprob_calls": 0.0, "scored_tokens": 0.0}
    for call in requests["generate"]:
        out["generate"] += same_tokens_seconds(engine, call, repeats)
    for call in requests["logprobs"]:
        out["logprobs"] += logprob_seconds(engine, call, repeats)
        seconds, tokens = prefill_seconds(engine, call, repeats)
        out["prefill"] += seconds
        out["logprob_tokens"] += tokens
        out["logprob_calls"] += 1
        out["scored_tokens"] += sum(len(c) for c in call.completions)
    return out


def ratio_ceilings(base: dict[str, float]) -> tuple[float, float]:
    """The most the log-likelihood ratio can be, whatever the engine does: plain prefill's
    seconds over those plus the vocabulary projection and log-softmax (measured alone,
    bench/model_costs.py) of every position of the calls (what vLLM's prompt_logprobs
    computes), and of the scored completion tokens only (the least any exact
    log-likelihood needs)."""
    vocab = linear_shapes(str(default_model_dir()))[0][-1]
    calls = base["logprob_calls"]
    ceilings = []
    for rows in (base["logprob_tokens"], base["scored_tokens"]):
        extra = calls * log_softmax_seconds(vocab, round(rows / calls))
        ceilings.append(base["prefill"] / (base["prefill"] + extra))
    return ceilings[0], ceilings[1]


def report(method: str, sink: MemorySink, bases: list[dict[str, float]]) -> None:
    measured = [s.metrics for s in sink.steps[1:]]

    def mean(phase: str) -> float:
        return float(np.mean([m[mk.time_key(phase)] for m in measured]))

    step_s = mean("step")
    tokens = float(np.mean([completion_tokens(s) for s in sink.steps[1:]]))
    print(f"\n{method.upper()}: {len(measured)} measured steps")
    print(f"  iteration time          {step_s:8.2f} s")
    for phase in PHASES:
        if mk.time_key(phase) in measured[0]:
            seconds = mean(phase)
            print(f"  {phase:<23} {seconds:8.2f} s  ({seconds / step_s:5.1%})")
    print(f"  generated tokens        {tokens:8.0f}   {tokens / step_s:7.1f} tokens/s")
    print(
        f"  perturb + restore       {(mean('perturb') + mean('restore')) * 1e3:8.0f} ms a step "
        "(bench/perturb.py sets them against a copy of the weights)"
    )
    if not bases:
        return
    base = {k: float(np.mean([b[k] for b in bases])) for k in bases[0]}
    same = base["generate"] + base["logprobs"]
    print(f"  unperturbed, same work  {same:8.2f} s")
    target = " (target >= 0.95)" if method == "es" else ""
    per_step = [
        (b["generate"] + b["logprobs"]) / m[mk.time_key("step")]
        for b, m in zip(bases, measured, strict=True)
    ]
    print(
        f"  efficiency              {same / step_s:8.2f}{target}   by step: "
        + ", ".join(f"{e:.2f}" for e in per_step)
    )
    if base["logprob_tokens"]:
        rate = base["logprob_tokens"] / mean("logprobs")
        prefill_rate = base["logprob_tokens"] / base["prefill"]
        print(
            f"  log-likelihood tokens/s {rate:8.0f}   plain prefill of the same tokens "
            f"{prefill_rate:.0f} tokens/s: ratio {rate / prefill_rate:.2f} (target >= 0.9)"
        )
        every, scored = ratio_ceilings(base)
        print(
            f"  ceiling of that ratio   {every:8.2f}   with every position's log-probability "
            f"(vLLM's prompt_logprobs); {scored:.2f} scoring only the "
            f"{base['scored_tokens'] / base['logprob_calls']:.0f} completion tokens of a call"
        )


def run(method: str, args: argparse.Namespace, engine: VLLMEngine | None, pool: EnginePool) -> None:
    # one engine: each measured step's requests replayed on it (StepSink)
    recorder = Recorder(engine) if engine is not None else None
    sink = StepSink(recorder, args.repeats)
    try:
        train(config(args, method), sink, pool=pool)
    finally:
        if recorder is not None:
            recorder.stop()
    report(method, sink, sink.bases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="es-conciseness")
    parser.add_argument("--steps", type=int, default=2, help="measured steps after a warm-up")
    parser.add_argument("--methods", default="es,lbes")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="baseline calls; median counts")
    args = parser.parse_args()
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)
    print(f"cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} cores usable", flush=True)

    cfg = config(args, "es")
    start = time.perf_counter()
    engine = None
    if args.engines == 1:
        engine = VLLMEngine(str(default_model_dir()), max_model_len=cfg.model.max_model_len)
        pool = EnginePool.wrap(engine)
    else:
        pool = EnginePool(str(default_model_dir()), num_engines=args.engines)
    print(f"engines up in {time.perf_counter() - start:.1f} s", flush=True)
    print(
        f"preset {args.preset}: population {cfg.es.population_size}, "
        f"{cfg.data.data_batch_size} prompts a member, {cfg.sampling.max_tokens} tokens"
    )
    try:
        for method in args.methods.split(","):
            run(method, args, engine, pool)
    finally:
        pool.shutdown()


if __name__ == "__main__":
    main()
