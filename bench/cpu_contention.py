"""How much a light load beside a CPU engine slows its generation, by the load's scheduling
priority: what a dashboard, a browser or any other process on the run's cores costs it.

    PYTHONPATH=$PWD .venv/bin/python bench/cpu_contention.py [--busy 0.3] [--calls 4]
                                                             [--model DIR]

One engine of the model (all the cores, as a run has them) times `--calls` generate calls
of 8 prompts, 32 tokens each, with no load, then beside one process that spins for `--busy`
of every 10 ms and sleeps the rest (about what 20 dashboard viewers cost, in bursts), run at
nice 0, nice 10, nice 19 and SCHED_IDLE, and with no load again. Each line: the median call,
each call, and the CPU-seconds the load got meanwhile.

An engine's OpenMP threads split each layer's work evenly among the cores: a thread that
loses its core holds up the others at the end of the layer, so a load that takes a share f
of each core slows the engine by about 1 / (1 - f)^2, not 1 / (1 - f), and by more when it
comes in short frequent bursts (docs/benchmarks.md, "Many viewers of a live run").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from engine.backends.vllm.engine import VLLMEngine
from engine.paths import PROJECT_ROOT

LOAD = r"""
import os, sys, time
policy, busy = sys.argv[1], float(sys.argv[2])
if policy == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
else:
    os.nice(int(policy.removeprefix("nice")))
period = 0.010
while True:
    end = time.perf_counter() + busy * period
    while time.perf_counter() < end:
        pass
    time.sleep((1 - busy) * period)
"""
POLICIES = ("none", "nice0", "nice10", "nice19", "idle", "none")
PROMPTS = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=float, default=0.3, help="the load's busy share")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument(
        "--model", type=Path, default=PROJECT_ROOT / "data/models/smollm2-135m-instruct"
    )
    args = parser.parse_args()
    engine = VLLMEngine(str(args.model))

    def call() -> float:
        start = time.perf_counter()
        engine.generate(PROMPTS, max_tokens=32)
        return time.perf_counter() - start

    call()  # warm-up
    print(f"8 prompts x 32 tokens, {psutil.cpu_count()} cores, load busy {args.busy:.0%}")
    for policy in POLICIES:
        load = None
        if policy != "none":
            command = [sys.executable, "-c", LOAD, policy, str(args.busy)]
            load = subprocess.Popen(command)
        times = [call() for _ in range(args.calls)]
        got = "-"
        if load is not None:
            cpu = psutil.Process(load.pid).cpu_times()
            got = f"{cpu.user + cpu.system:.1f} CPU-s"
            load.kill()
            load.wait()
        each = " ".join(f"{t:.2f}" for t in times)
        print(
            f"load {policy:<7} call median {statistics.median(times):6.2f} s  "
            f"(each {each})  the load got {got}",
            flush=True,
        )


if __name__ == "__main__":
    main()
