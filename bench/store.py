"""The run store at its design scale: 100 runs x 2,000 steps x 20 metric keys in SQLite.

    .venv/bin/python bench/store.py [--runs 100] [--steps 2000] [--keys 20]

Prints:
- ingest: steps/s and metric rows/s written through the database sink (one run's steps,
  each with its metrics and 8 population rows in one transaction, as the worker writes
  them), and the sink's milliseconds per step, to set against a training step's seconds;
- the Runs page query: one page of runs with their latest metrics;
- the chart query of Compare: one metric of 10 runs, each reduced in SQL to about 500
  buckets keeping min, max and last.

The other runs are seeded through bulk inserts (bench/seed_runs.py: the sink path for 4
million rows would take the benchmark's whole time to prove the same rate again).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seed_runs import Shape, metric_names, seed_runs
from tqdm import tqdm

from engine.sink import PopulationRecord, StepReport
from jobs.sink import DatabaseSink
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store

POPULATION = 8


def best_of(fn: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def ingest_through_sink(store: Store, steps: int, keys: list[str]) -> float:
    """Seconds to write `steps` steps of one run through the database sink."""
    run = store.create_run(
        name="ingest", method="es", config={}, total_steps=steps, status=RunStatus.RUNNING
    )
    sink = DatabaseSink(store, run.id, run.attempt)
    start = time.perf_counter()
    for step in tqdm(range(1, steps + 1), desc="ingest through the sink", leave=False):
        sink.log_step(
            StepReport(
                step=step,
                metrics={k: step * 0.001 + i for i, k in enumerate(keys)},
                population=[
                    PopulationRecord(member=m, seed=m, fitness=float(m), shaped_fitness=0.0)
                    for m in range(POPULATION)
                ],
                wall_time=float(step),
            )
        )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--points", type=int, default=500)
    args = parser.parse_args()
    keys = metric_names(args.keys)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        store = Store(url)

        seconds = ingest_through_sink(store, args.steps, keys)
        rows = args.steps * (len(keys) + POPULATION)
        print(
            f"ingest through the database sink: {args.steps / seconds:,.0f} steps/s, "
            f"{rows / seconds:,.0f} rows/s ({len(keys)} metrics + {POPULATION} population "
            f"rows a step), {seconds / args.steps * 1000:.1f} ms a step"
        )

        start = time.perf_counter()
        ids = seed_runs(store, args.runs, Shape(args.steps, len(keys)))
        total = args.runs * args.steps * len(keys)
        print(
            f"seeded {args.runs} runs x {args.steps} steps x {len(keys)} keys ({total:,} "
            f"rows) in {time.perf_counter() - start:.0f} s"
        )

        def run_list() -> Any:
            page, _ = store.search_runs(limit=50)
            return store.latest_metrics([r.id for r in page])

        took, latest = best_of(run_list)
        assert all(len(v) == len(keys) for k, v in latest.items() if k in ids)
        print(
            f"run list (page of 50 runs with their latest metrics): {took * 1000:.1f} ms "
            "(target < 200 ms)"
        )

        key = keys[0]
        took, series = best_of(
            lambda: [store.metric_buckets(r, key, args.points) for r in ids[:10]]
        )
        assert max(b["max"] for b in series[0]) >= 5.0  # the spike survives the reduction
        print(
            f"one metric of 10 runs reduced in SQL to {len(series[0])} buckets a run "
            f"(min, max, last kept): {took * 1000:.1f} ms (target < 300 ms)"
        )
        store.close()
    print(
        "command: .venv/bin/python bench/store.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    )


if __name__ == "__main__":
    main()
