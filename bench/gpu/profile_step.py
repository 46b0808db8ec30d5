"""Where an ES step's time goes on a GPU: torch's profiler around one step (after a warm-up
step) on one engine in this process, its CUDA kernels summed by name and by kind, and the
GPU's busy time against the step's wall time; then the same step under cProfile, for the
host's share (what the GPU waits on: vLLM's scheduler, sampling, the trainer's Python).

    python3 bench/gpu/profile_step.py MODEL [--lora] [--rank 4] [--lora-kernels deterministic]
        [--population 32] [--prompts 8] [--max-tokens 128] --out DIR

Prints the summary and writes DIR/profile-<mode>.txt (the same, with the top kernels and the
host's top functions) and DIR/trace-<mode>.json.gz (the CUDA timeline, for Perfetto).
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utilization import common_options, es_config, full_rank_pool, lora_pool

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.sink import MemorySink, StepReport
from engine.trainer import train

KINDS = {
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


def one_step(pool: EnginePool, args: argparse.Namespace, sink: StepSink | None = None) -> float:
    """Seconds of one ES step of the measured configuration (the step's own clock)."""
    sink = sink or StepSink()
    train(es_config(args, lora=args.lora), sink, pool=pool)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--lora", action="store_true", help="the low-rank mode (else full rank)")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--lora-kernels", default="deterministic")
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--memory", type=float, default=0.4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.steps, args.tensor_parallel_size, args.engines_per_gpu = 0, 1, 1  # es_config's
    mode = f"lora-r{args.rank}" if args.lora else "full"
    args.out.mkdir(parents=True, exist_ok=True)
    common = common_options(args)
    pool = lora_pool(args, common) if args.lora else full_rank_pool(args, 1, common)
    try:
        lines = [f"{args.model}, {mode}, population {args.population} x {args.prompts} prompts"]
        lines.append(
            f"warm-up step {one_step(pool, args):.3f} s; plain step {one_step(pool, args):.3f} s"
        )
        lines += profile_kernels(pool, args, args.out / f"trace-{mode}.json.gz")
        lines += profile_host(pool, args)
    finally:
        pool.shutdown()
    text = "\n".join(lines)
    (args.out / f"profile-{mode}.txt").write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
