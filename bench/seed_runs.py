"""Finished runs written straight into a store's tables, for the store and dashboard benchmarks
(bench/store.py, bench/dashboard.py): millions of rows in minutes, where the sink's per-step
path would take hours to prove a rate that bench/store.py measures once.

Each run is its own transaction through the driver (executemany on SQLite, COPY on
PostgreSQL): metrics with their latest values, population rows and samples, shaped like what a
worker writes (the metric keys are the dashboard's own, the samples' prompts and completions
are text a search can find).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from engine import metrics as mk
from jobs.store.status import RunStatus
from jobs.store.store import Store

PROMPTS_PER_STEP = 25
SAMPLES_PER_PROMPT = 4
SAMPLES_PER_STEP = 2 * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
"""A step's samples, train and eval."""
COMPLETION = (
    "first add the two numbers then subtract the third and multiply the result by four so "
    "the answer is close but we check each step again before we give it"
)
"""What each completion says, its words rotated so that completions differ."""
SEARCH_WORD = "equals"
"""A word every prompt holds, followed by its target: `equals 42` finds a few prompts."""


@dataclass(frozen=True)
class Shape:
    """How much each seeded run holds."""

    steps: int
    keys: int
    population: int = 0
    samples: int = 0
    """Samples a run holds, train and eval alike, recorded every `sample_every` steps."""

    @property
    def sample_every(self) -> int:
        return max(1, self.steps * SAMPLES_PER_STEP // max(1, self.samples))

    def sample_steps(self) -> range:
        return (
            range(self.sample_every, self.steps + 1, self.sample_every)
            if self.samples
            else range(0)
        )


def metric_names(count: int) -> list[str]:
    """`count` metric keys, those the Run page and Compare chart first, then made-up ones."""
    names = [mk.reward_key(s, "reward", stat) for s in (mk.TRAIN, mk.EVAL) for stat in mk.STATS]
    names += [mk.TOKENS_PER_SECOND, mk.NOISE_STD, mk.LEARNING_RATE]
    names += [mk.time_key(p) for p in mk.PHASES]
    names += [mk.completion_key(s, "mean_length") for s in (mk.TRAIN, mk.EVAL)]
    return (names + [f"bench/extra_{i}" for i in range(count)])[:count]


def seed_runs(store: Store, runs: int, shape: Shape, *, desc: str = "seeding runs") -> list[int]:
    """`runs` finished runs (every 50th still running, every 7th failed) of `shape`; their ids.
    A tqdm bar counts the runs."""
    keys = metric_names(shape.keys)
    ids = []
    for i in tqdm(range(runs), desc=desc, unit="run"):
        status = (
            RunStatus.RUNNING
            if i % 50 == 49
            else RunStatus.FAILED
            if i % 7 == 6
            else RunStatus.SUCCEEDED
        )
        run = store.create_run(
            name=f"run-{i}",
            method="es" if i % 2 else "lbes",
            config={"model": "m", "train_file": "data/t/train.parquet"},
            total_steps=shape.steps,
            tags=[f"t{i % 7}"],
            status=status,
        )
        _write_run(store, run.id, i, shape, keys)
        ids.append(run.id)
    return ids


def _write_run(store: Store, run_id: int, index: int, shape: Shape, keys: list[str]) -> None:
    steps = shape.steps

    def value(step: int) -> float:
        return (step % 97) / 97 + (5.0 if step == steps // 3 else 0.0)

    metrics = [
        (run_id, k, step, value(step), float(step)) for k in keys for step in range(1, steps + 1)
    ]
    latest = [(run_id, k, steps, value(steps), float(steps)) for k in keys]
    population = [
        (run_id, step, m, m, value(step) + m * 0.01, 0.0)
        for step in range(1, steps + 1)
        for m in range(shape.population)
    ]
    tables: list[tuple[str, Sequence[str], Iterable[tuple[Any, ...]]]] = [
        ("metrics", ("run_id", "key", "step", "value", "wall_time"), metrics),
        ("latest_metrics", ("run_id", "key", "step", "value", "wall_time"), latest),
        (
            "population",
            ("run_id", "step", "member", "seed", "fitness", "shaped_fitness"),
            population,
        ),
        (
            "samples",
            (
                "run_id",
                "step",
                "split",
                "prompt_index",
                "sample_index",
                "member",
                "prompt",
                "completion",
                "reward",
                "reward_parts",
                "kept",
            ),
            _samples(run_id, index, shape),
        ),
    ]
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for table, columns, rows in tables:
            _insert(cursor, store.engine.dialect.name, table, columns, rows)
        cursor.execute(f"UPDATE runs SET step = {steps} WHERE id = {run_id}")
        raw.commit()
    finally:
        raw.close()


def _samples(run_id: int, index: int, shape: Shape) -> Iterable[tuple[Any, ...]]:
    words = COMPLETION.split()
    for step in shape.sample_steps():
        for split in ("train", "eval"):
            for p in range(PROMPTS_PER_STEP):
                target = (index + step + p) % 100
                prompt = (
                    f"Using the numbers {p}, {step % 13}, {index % 17} and 7, write an "
                    f"equation that {SEARCH_WORD} {target}."
                )
                for k in range(SAMPLES_PER_PROMPT):
                    start = (index + p + k) % len(words)
                    completion = (
                        " ".join(words[start:] + words[:start])
                        + f" so {p} + {k} {SEARCH_WORD} {p + k}"
                    )
                    reward = ((p + k + step) % 10) / 10
                    yield (
                        run_id,
                        step,
                        split,
                        p,
                        k,
                        k % shape.population if split == "train" and shape.population else None,
                        prompt,
                        completion,
                        reward,
                        f'{{"answer": {reward}}}',
                        None,
                    )


def _insert(
    cursor: Any, dialect: str, table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]
) -> None:
    """Rows through the driver: COPY on PostgreSQL, executemany on SQLite."""
    names = ", ".join(columns)
    if dialect == "postgresql":
        with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    else:
        marks = ", ".join("?" for _ in columns)
        cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)
