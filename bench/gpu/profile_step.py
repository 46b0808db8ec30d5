"""Where an ES step's time goes on a GPU: torch's profiler around one step (after a warm-up
step) on one engine in this process, its CUDA kernels summed by name and by kind, and the
GPU's busy time against the step's wall time; then the same step under cProfile, for the
host's share (what the GPU waits on: vLLM's scheduler, sampling, the trainer's Python); then
the calls of one step that made the host wait for the GPU (torch's sync debug mode), by the
code that made them: with asynchronous scheduling a wait inside a decode step serializes the
host's preparation of the next step with the GPU's work on this one.

    python3 bench/gpu/profile_step.py MODEL [--lora | --batched] [--rank 4]
        [--lora-kernels deterministic] [--antithetic] [--population 32] [--prompts 8]
        [--max-tokens 128] [--reference-call] --out DIR

The step is full rank's (one member at a time), the low-rank mode's with --lora, or
perturbation full_batched's with --batched (as utilization.py's rows); --reference-call
profiles utilization.py's 256-prompt call instead, on the same engine.

Prints the summary and writes DIR/profile-<mode>.txt (the same, with the top kernels and the
host's top functions) and DIR/trace-<mode>.json.gz (the CUDA timeline, for Perfetto).

cProfile's own cost distorts a host-bound step (it doubled the step here). For the host's true
shares, run N steps with no profiler inside a sampler and summarize the step's stacks with
bench/gpu/host_stacks.py:

    py-spy record --nonblocking -r 250 -f raw -o stacks.txt -- \
        python3 bench/gpu/profile_step.py MODEL --lora --out DIR --steps-only 10
    python3 bench/gpu/host_stacks.py stacks.txt
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import pstats
import re
import shutil
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utilization import (
    ONE_ENGINE,
    add_run_arguments,
    batch_prompts,
    common_options,
    es_config,
    full_rank_pool,
    lora_pool,
    plain_call,
)

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.sink import MemorySink, StepReport
from engine.trainer import train

KINDS = {
    "member noise": re.compile(r"member_noise", re.I),  # perturbation full_batched's kernel
    "lora": re.compile(r"lora|shrink|expand|punica|sgmv|bgmv", re.I),
    "attention": re.compile(r"flash|attn|attention", re.I),  # before matmul: FA3 is sm90 cutlass
    "matmul": re.compile(r"gemm|cutlass|sm90|nvjet|cublas|matmul", re.I),
    "sampling": re.compile(r"sort|topk|top_k|argmax|softmax|sample|gather|scatter", re.I),
}
"""Kernel kinds by name (first match wins); the rest is 'other' (norms, activations, copies)."""


def kind(name: str) -> str:
    return next((k for k, pattern in KINDS.items() if pattern.search(name)), "other")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: the time some kernel ran."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


class StepSink(MemorySink):
    """Calls `at_step` when the step is reported: a profiler stops there, before the run's
    end writes the final model."""

    def __init__(self, at_step: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.at_step: Callable[[], None] | None = at_step

    def log_step(self, report: StepReport) -> None:
        if self.at_step is not None:
            self.at_step()
            self.at_step = None
        super().log_step(report)


def perturbation(args: argparse.Namespace) -> str:
    return "lora" if args.lora else "full_batched" if args.batched else "full"


def one_step(pool: EnginePool, args: argparse.Namespace, sink: StepSink | None = None) -> float:
    """Seconds of one ES step of the measured configuration (the step's own clock), or with
    --reference-call of utilization.py's reference call: BATCH prompts on the unperturbed
    engine."""
    sink = sink or StepSink()
    if args.reference_call:
        seconds, _ = plain_call(pool._local, batch_prompts(), args.max_tokens)
        if sink.at_step is not None:
            sink.at_step()
        return seconds
    train(es_config(args, perturbation(args)), sink, pool=pool)
    return sink.steps[0].metrics[mk.time_key("step")]


def profile_kernels(pool: EnginePool, args: argparse.Namespace, trace: Path) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    # without CUDA (a check of this script on the CPU build) the "kernels" are CPU ops
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    prof = profile(activities=[getattr(ProfilerActivity, device)])
    prof.start()
    step = one_step(pool, args, StepSink(prof.stop))
    kernels = [e for e in prof.events() if e.device_type.name == device]
    busy = busy_seconds([(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in kernels])
    by_name: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    for e in kernels:
        seconds = (e.time_range.end - e.time_range.start) / 1e6
        by_name[e.name] = by_name.get(e.name, 0.0) + seconds
        by_kind[kind(e.name)] = by_kind.get(kind(e.name), 0.0) + seconds
    lines = [
        f"step {step:.3f} s under the profiler; {device} busy {busy:.3f} s ({busy / step:.0%}), "
        f"{len(kernels)} kernels",
        "kernel time by kind: "
        + ", ".join(f"{k} {s:.3f} s" for k, s in sorted(by_kind.items(), key=lambda x: -x[1])),
        "top kernels (s, name):",
        *(f"  {s:8.4f}  {n[:150]}" for n, s in sorted(by_name.items(), key=lambda x: -x[1])[:25]),
    ]
    raw = trace.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as f, gzip.open(trace, "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    return lines


def profile_host(pool: EnginePool, args: argparse.Namespace) -> list[str]:
    profiler = cProfile.Profile()
    profiler.enable()
    step = one_step(pool, args, StepSink(profiler.disable))
    lines = [f"step {step:.3f} s under cProfile"]
    for order in ("cumulative", "tottime"):  # where the step's host time goes; what spends it
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(35)
        lines += [f"top functions by {order} time:", text.getvalue()]
    return lines


def code_site(stack: list[traceback.FrameSummary], depth: int = 3) -> str:
    """The innermost `depth` frames outside torch and the warnings machinery: the code whose
    call made the host wait."""
    frames = [f for f in stack if "/torch/" not in f.filename and "/warnings" not in f.filename]
    return " < ".join(
        f"{'/'.join(Path(f.filename).parts[-2:])}:{f.lineno}({f.name})"
        for f in reversed(frames[-depth:])
    )


def profile_syncs(pool: EnginePool, args: argparse.Namespace) -> list[str]:
    """Every call of one step that synchronized with the GPU, counted by code site."""
    import torch

    if not torch.cuda.is_available():
        return ["synchronizing calls: no CUDA here"]
    sites: Counter[str] = Counter()

    def record(*_args: object, **_kwargs: object) -> None:
        sites[code_site(traceback.extract_stack()[:-1])] += 1

    def stop() -> None:
        torch.cuda.set_sync_debug_mode(0)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step = one_step(pool, args, StepSink(stop))
        finally:
            stop()
    lines = [f"step {step:.3f} s in sync debug mode; {sum(sites.values())} synchronizing calls:"]
    lines += [f"  {n:6d}  {site}" for site, n in sites.most_common(25)]
    return lines


def apply_adapters_once() -> None:
    """An experiment (--patch adapters-once): vLLM 0.26's worker re-adds every adapter of the
    batch on every decode step (LRUCacheWorkerLoRAManager._apply_adapters: a lookup, an LRU
    touch and an activation per adapter), though within one call the set never changes. Skip
    it when the set is the last step's."""
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

    original = LRUCacheWorkerLoRAManager._apply_adapters

    def _apply_adapters(self: LRUCacheWorkerLoRAManager, requests: set) -> None:
        key = frozenset((r.lora_int_id, r.lora_path) for r in requests if r)
        if key != getattr(self, "_last_requested", None):
            original(self, requests)
            self._last_requested = key

    LRUCacheWorkerLoRAManager._apply_adapters = _apply_adapters


PATCHES = {"adapters-once": apply_adapters_once}


class GcClock:
    """Seconds the garbage collector held the interpreter, by generation: a pause lands
    inside whatever function allocated, so a sampler spreads it over everything."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.counts[info["generation"]] += 1

    def line(self) -> str:
        return f"gc {sum(self.seconds):.3f} s in {sum(self.counts)} collections " + ", ".join(
            f"gen {g}: {n} / {s:.3f} s"
            for g, (n, s) in enumerate(zip(self.counts, self.seconds, strict=True))
        )


def steps_only(pool: EnginePool, args: argparse.Namespace, n: int) -> list[str]:
    """n steps with no profiler, for a sampler outside the process (py-spy), each with the
    garbage collector's share."""
    import gc

    lines = []
    for i in range(n):
        clock = GcClock()
        gc.callbacks.append(clock)
        try:
            seconds = one_step(pool, args)
        finally:
            gc.callbacks.remove(clock)
        lines.append(f"step {i}: {seconds:.3f} s; {clock.line()}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser)
    parser.set_defaults(**ONE_ENGINE)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--lora", action="store_true", help="the low-rank mode (else full rank)")
    modes.add_argument(
        "--batched", action="store_true", help="perturbation full_batched (else full rank)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--reference-call",
        action="store_true",
        help="measure utilization.py's reference call (256 prompts, no member) instead of a step",
    )
    parser.add_argument(
        "--steps-only",
        type=int,
        metavar="N",
        help="after the warm-up, N steps with no profiler (for py-spy); nothing else",
    )
    parser.add_argument("--patch", choices=sorted(PATCHES), action="append", default=[])
    args = parser.parse_args()
    for name in args.patch:
        PATCHES[name]()
    labels = {"lora": f"lora-r{args.rank}", "full_batched": "full-batched", "full": "full"}
    mode = "-".join(
        [labels[perturbation(args)]]
        + (["antithetic"] if args.antithetic else [])
        + (["reference-call"] if args.reference_call else [])
        + args.patch
    )
    args.out.mkdir(parents=True, exist_ok=True)
    common = common_options(args)
    slots = perturbation(args) != "full"
    pool = (
        lora_pool(args, common, 1, perturbation(args)) if slots else full_rank_pool(args, 1, common)
    )
    try:
        lines = [f"{args.model}, {mode}, population {args.population} x {args.prompts} prompts"]
        lines.append(
            f"warm-up step {one_step(pool, args):.3f} s; plain step {one_step(pool, args):.3f} s"
        )
        if args.steps_only:
            lines += steps_only(pool, args, args.steps_only)
        else:
            lines += profile_kernels(pool, args, args.out / f"trace-{mode}.json.gz")
            lines += profile_host(pool, args)
            lines += profile_syncs(pool, args)
    finally:
        pool.shutdown()
    text = "\n".join(lines)
    name = f"steps-{mode}.txt" if args.steps_only else f"profile-{mode}.txt"
    (args.out / name).write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
