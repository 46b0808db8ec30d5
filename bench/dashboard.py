"""The dashboard's database reads at scale: the Runs page (one page of 50 runs out of many,
with sparklines and best eval reward) and one metric of a long run, reduced in SQL.

    .venv/bin/python bench/dashboard.py [--runs 1000] [--steps 200] [--long 1000000]

Seeds a temporary SQLite database through the Store's bulk path and prints seconds per query.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from engine import metrics as mk
from jobs.store.migrate import upgrade
from jobs.store.store import Store


def timed(label: str, fn, repeat: int = 3):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    print(f"{label:<55} {best * 1000:8.1f} ms")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--long", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        store = Store(url)
        train, evals = mk.reward_key(mk.TRAIN), mk.reward_key(mk.EVAL)
        start = time.perf_counter()
        from jobs.store import models  # bulk inserts: record_step per row takes minutes

        ids = [
            store.create_run(
                name=f"run-{i}",
                method="es" if i % 2 else "lbes",
                config={"model": "m", "train_file": "data/t/train.parquet"},
                total_steps=args.steps,
                tags=[f"t{i % 7}"],
            ).id
            for i in range(args.runs)
        ]
        rows = [
            {
                "run_id": r,
                "key": k,
                "step": step,
                "value": step / args.steps,
                "wall_time": float(step),
            }
            for r in ids
            for k in (train, evals)
            for step in range(args.steps)
        ]
        with store._session() as s:
            s.execute(models.Metric.__table__.insert(), rows)
            s.execute(
                models.LatestMetric.__table__.insert(),
                [x for x in rows if x["step"] == args.steps - 1],
            )
        print(
            f"seeded {args.runs} runs x {args.steps} steps in {time.perf_counter() - start:.0f} s"
        )
        runs, _ = timed("search_runs (page of 50, newest)", lambda: store.search_runs(limit=50))
        timed(
            "search_runs (tag + method filter)",
            lambda: store.search_runs(tag="t3", methods=["es"], limit=50),
        )
        ids = [r.id for r in runs]
        timed("sparklines (50 runs x 30 points)", lambda: store.sparklines(ids, train, 30))
        timed("best_metrics (50 runs)", lambda: store.best_metrics(ids, evals))
        long = store.create_run(name="long", method="es", config={}, total_steps=args.long)
        with store._session() as s:
            s.execute(
                models.Metric.__table__.insert(),
                [
                    {
                        "run_id": long.id,
                        "key": train,
                        "step": k,
                        "value": (k % 997) / 997,
                        "wall_time": float(k),
                    }
                    for k in range(args.long)
                ],
            )
        timed(
            f"metric_buckets ({args.long} points -> 400)",
            lambda: store.metric_buckets(long.id, train, 400),
        )
        store.close()


if __name__ == "__main__":
    main()
