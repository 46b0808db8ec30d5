"""The dashboard's pages against a large run store: each page's own store calls, timed against
its target, on SQLite or PostgreSQL.

    .venv/bin/python bench/dashboard.py [--runs 1000] [--steps 1000] [--keys 20]
        [--population 8] [--samples 2000] [--url URL | --postgres]

By default 1,000 runs (every 50th still running: the Runs page reads its events), each with
20,000 metric rows (1,000 steps x 20 keys), 8,000 population rows and 2,000 samples (train and
eval every 100 steps). SQLite: the seeded file is kept under build/bench/ and reused by later
invocations of the same shape (it is written under another name and renamed once complete).
`--url` measures that database, seeding it first if it holds no run; `--postgres` starts a
throw-away PostgreSQL server (tests/jobs/conftest.py's) and seeds it.

Each page runs the store calls its code in app/ makes, in the same order (the Run page's charts
also once through app/run_charts.py itself, with pandas and Altair): "cold" is the best of 3
first views, each on a new Store (new connections, nothing compiled) and runs not read before,
with the database's files dropped from the operating system's cache first (SQLite's file;
`--postgres`: the server is restarted and its files dropped; a `--url` server keeps its
caches); "warm" the best of 3 repeats of one view. A page passes when its cold time is under
its target.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from seed_runs import SAMPLES_PER_STEP, SEARCH_WORD, Shape, seed_runs  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from app import run_charts  # noqa: E402
from app.inspector import SampleFilter, filter_samples  # noqa: E402
from app.samples_view import SPLITS  # noqa: E402
from engine import metrics as mk  # noqa: E402
from jobs.phases import phase_of  # noqa: E402
from jobs.store.database import describe  # noqa: E402
from jobs.store.migrate import upgrade  # noqa: E402
from jobs.store.store import Store  # noqa: E402

PAGE_SIZE = 50  # app/app_pages/runs.py
LISTED = 200  # the runs the Samples page lists (app/app_pages/samples.py)
COMPARED = 10
REPEAT = 3
TRAIN, EVAL = mk.reward_key(mk.TRAIN), mk.reward_key(mk.EVAL)
RUN_CHART_KEYS = (
    *run_charts.REWARD_CHARTS,
    *(options[0] for options in run_charts.SCHEDULES),
    *(mk.time_key(p) for p in mk.PHASES if p != "step"),
)


@dataclass(frozen=True)
class Page:
    name: str
    target: float
    """Seconds."""
    view: Callable[[Store, list[int], int], Any]
    """One view of the page: the store, every run id (oldest first), which view (0, 1, ...:
    each picks runs of its own)."""


def runs_page(store: Store, ids: list[int], view: int, **search: Any) -> Any:
    """app/app_pages/runs.py: the page of runs (read again for the page number and by the
    table's fragment), their sparklines, best eval reward, the database's clock, and the
    phase of each running run."""
    page = view + 1
    query = {"limit": PAGE_SIZE, "offset": PAGE_SIZE * (page - 1), **search}
    _, total = store.search_runs(**query)
    if total == 0:
        store.count_runs()
    if total > PAGE_SIZE:
        store.search_runs(**query)
    shown, _ = store.search_runs(**query)
    shown_ids = [r.id for r in shown]
    store.sparklines(shown_ids, TRAIN, points=30)
    store.best_metrics(shown_ids, EVAL)
    store.database_now()
    return [phase_of(store, r) for r in shown]


def run_page_charts(store: Store, ids: list[int], view: int) -> Any:
    """app/run_charts.py's reads: the population's fitness, then each chart's metric."""
    run = store.get_run(ids[len(ids) // 2 + view])
    store.population_points(run.id)
    return [store.metric_buckets(run.id, key) for key in RUN_CHART_KEYS]


def run_page_charts_built(store: Store, ids: list[int], view: int) -> Any:
    """The same through app/run_charts.py itself: the store's reads and the charts' making."""
    run = store.get_run(ids[len(ids) // 2 + view])
    return run_charts.population(store, run), run_charts.metric_figures(store, run)


def compare_page(store: Store, ids: list[int], view: int) -> Any:
    """app/app_pages/compare.py with COMPARED runs spread over the store."""
    picked = [ids[(view + 1 + k * len(ids) // COMPARED) % len(ids)] for k in range(COMPARED)]
    runs = [store.get_run(i) for i in picked]
    sorted({k for r in runs for k in store.metric_keys(r.id)})
    [store.metric_buckets(r.id, TRAIN) for r in runs]
    store.latest_metrics([r.id for r in runs])
    store.best_metrics([r.id for r in runs], EVAL)
    common = sorted(set.intersection(*(set(store.sample_steps(r.id, "eval")) for r in runs)))
    return {r.id: store.samples(r.id, split="eval", step=common[-1]) for r in runs}


def samples_page(store: Store, ids: list[int], view: int) -> Any:
    """app/app_pages/samples.py with `?run=` naming a run older than those it lists, and a
    text search (app/inspector.py filters the step's samples)."""
    runs = store.list_runs(limit=LISTED)
    wanted = ids[len(ids) // 3 + view]
    if wanted not in {r.id for r in runs}:
        store.get_run(wanted)
    steps = store.sample_steps(wanted, SPLITS[0])
    samples = store.samples(wanted, split=SPLITS[0], step=steps[-1])
    found = filter_samples(samples, SampleFilter(text=f"{SEARCH_WORD} 1"))
    assert found, "the text search found nothing: the seeded samples are not what it expects"
    return found


PAGES = (
    Page("Runs page (page of 50, newest first)", 1.0, runs_page),
    Page(
        "Runs page, filtered (name text, tag, method)",
        1.0,
        lambda s, ids, v: runs_page(s, ids, v, text="run-1", tag="t3", methods=["es"]),
    ),
    Page("Run page charts (store reads)", 2.0, run_page_charts),
    Page("Run page charts (reads + pandas + Altair)", 2.0, run_page_charts_built),
    Page(f"Compare of {COMPARED} runs", 3.0, compare_page),
    Page("Samples page with a text search", 2.0, samples_page),
)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def uncache(folder: Path) -> None:
    """Drop the files under `folder` (or that file) from the operating system's cache: the
    next read comes from the disk. Only these files: other processes' caches stay."""
    for path in [folder] if folder.is_file() else [p for p in folder.rglob("*") if p.is_file()]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(
    url: str, ids: list[int], page: Page, forget: Callable[[], None]
) -> tuple[float, float]:
    """(cold, warm) seconds: the best of REPEAT first views on new stores, each after
    `forget` (which empties the caches it can), and of REPEAT repeats of one view."""
    cold = []
    for view in range(REPEAT):
        forget()
        store = Store(url)
        cold.append(timed(lambda v=view, s=store: page.view(s, ids, v)))
        store.close()
    store = Store(url)
    page.view(store, ids, REPEAT)
    warm = min(timed(lambda: page.view(store, ids, REPEAT)) for _ in range(REPEAT))
    store.close()
    return min(cold), warm


def seeded(url: str, runs: int, shape: Shape) -> list[int]:
    """The ids of the database's runs, seeding `runs` of `shape` into an empty one."""
    upgrade(url)
    store = Store(url)
    try:
        found = store.count_runs()
        if found == 0:
            start = time.perf_counter()
            seed_runs(store, runs, shape)
            if store.engine.dialect.name == "postgresql":
                # what autovacuum does to a server's tables in its own time: statistics for
                # the planner, and the visibility map that index-only scans need
                engine = store.engine.execution_options(isolation_level="AUTOCOMMIT")
                with engine.connect() as conn:
                    conn.exec_driver_sql("VACUUM ANALYZE")
            print(f"seeded {runs} runs in {time.perf_counter() - start:.0f} s")
        elif found != runs:
            raise SystemExit(
                f"{describe(url)} holds {found} runs, not {runs}: give an empty database "
                "or the --runs it was seeded with"
            )
        return sorted(r.id for r in store.list_runs(limit=runs))
    finally:
        store.close()


def sqlite_cache(runs: int, shape: Shape) -> str:
    """The URL of the cached SQLite file of this shape, seeded first if missing."""
    folder = ROOT / "build" / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"dashboard-{runs}r-{shape.steps}s-{shape.keys}k-{shape.population}p-{shape.samples}x"
    path = folder / f"{name}.db"
    if not path.exists():
        partial = folder / f"{name}.partial.db"
        for leftover in folder.glob(f"{name}.partial.db*"):
            leftover.unlink()
        seeded(f"sqlite:///{partial}", runs, shape)  # closed: its WAL is checkpointed away
        os.replace(partial, path)
    print(f"database: {path} ({path.stat().st_size / 2**30:.1f} GiB)")
    return f"sqlite:///{path}"


def report(url: str, ids: list[int], forget: Callable[[], None] = lambda: None) -> None:
    print(f"{'page':<46} {'target':>7} {'cold':>8} {'warm':>8}  verdict")
    for page in PAGES:
        cold, warm = measure(url, ids, page, forget)
        verdict = "pass" if cold < page.target else "FAIL"
        print(
            f"{page.name:<46} {page.target:>6.1f}s {cold * 1000:>6.0f}ms {warm * 1000:>6.0f}ms"
            f"  {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="samples per run")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a database URL (seeded first when it holds no run)")
    where.add_argument(
        "--postgres", action="store_true", help="a throw-away PostgreSQL server, seeded here"
    )
    args = parser.parse_args()
    if args.runs < COMPARED or args.samples < SAMPLES_PER_STEP:
        parser.error(
            f"--runs {args.runs} --samples {args.samples}: the pages need at least {COMPARED} "
            f"runs and {SAMPLES_PER_STEP} samples a run (one step's train and eval samples)"
        )
    shape = Shape(args.steps, args.keys, args.population, args.samples)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    if args.postgres:
        from tests.jobs.conftest import PostgresServer

        server = PostgresServer()

        def restart() -> None:
            server.shut_down()
            uncache(Path(server.data))
            server.start_again()

        try:
            url = server.create_database()
            report(url, seeded(url, args.runs, shape), restart)
        finally:
            server.stop()
    elif args.url:
        report(args.url, seeded(args.url, args.runs, shape))
    else:
        url = sqlite_cache(args.runs, shape)
        path = Path(make_url(url).database or "")
        report(url, seeded(url, args.runs, shape), lambda: uncache(path))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
