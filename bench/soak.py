"""A soak of `eslab serve`: many tiny real runs queued through the CLI, some cancelled (while
queued, or once they have a checkpoint) and some of those resumed, all at random but seeded;
at the end, the checks of bench/soak_checks.py, as a table with the figures:

- every run succeeded, was cancelled, or failed with a reason; every resumed run succeeded;
- every recorded step is present once (no gap, no repeat, a succeeded run has all its steps);
- no Ray job is pending or running once every run has ended, and no process that serve
  started (its Ray head, the runs' workers and vLLM engines, its dashboard) outlives its stop;
- runs per hour, and the resident memory of the dashboard and of serve at the start and end.

    python3 bench/soak.py --out FOLDER [--runs 200] [--concurrent 2] [--cancel-fraction 0.2]
        [--resume-fraction 0.5] [--seed 0] [--port PORT] [--set OPTION=VALUE ...]

A tiny run is the es-conciseness preset on the default model with 2 members, 1 prompt, 8
tokens, 2 to 4 steps (seeded) and a checkpoint every step, so that a cancel leaves one to
resume from. Each run starts its own vLLM engine, so the 200 runs of the default took 1.3 hours
on a 2-core Xeon (docs/benchmarks.md). The database is FOLDER/eslab.db, serve's output
FOLDER/serve.log, the runs' outputs FOLDER/runs/ (each removed once its run has ended for good,
or 200 runs would take about 100 GB, except a failed run's, kept to be examined;
--keep-outputs keeps them all), every figure
FOLDER/soak.json. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from tqdm import tqdm  # noqa: E402

from app.cli.common import print_table  # noqa: E402
from bench.product_path import StageFailed, eslab, submit  # noqa: E402
from bench.soak_checks import end_checks  # noqa: E402
from engine.paths import OUTPUT_ROOTS_SETTING  # noqa: E402
from jobs.ray_jobs import JobState, RayJobs, RayUnavailableError  # noqa: E402
from jobs.serve_leftovers import Head, ServeNote, head_processes, read_note  # noqa: E402
from jobs.store.migrate import upgrade  # noqa: E402
from jobs.store.status import RunStatus  # noqa: E402
from jobs.store.store import Store  # noqa: E402
from tests.app.serving import eslab_serve, serve_env  # noqa: E402

POLL_S = 2.0
NOTE_DEADLINE_S = 60.0
LEFT_GRACE_S = 30.0
TINY = [
    "population_size=2",
    "data_batch_size=1",
    "max_tokens=8",
    "eval_strategy=no",
    "save_strategy=steps",
    "save_steps=1",
    "save_total_limit=1",
    "max_model_len=1024",
    "max_num_seqs=16",
]


@dataclass
class Plan:
    """What the soak does to one run: cancel it while queued, once it has a checkpoint, or
    never; and whether to resume it once cancelled."""

    cancel: str | None  # "queued", "running" or None
    resume: bool
    cancelled: bool = False
    resumed: bool = False

    def done_with(self, status: RunStatus) -> bool:
        """Whether the run has ended for good: nothing more will be asked of it."""
        if not status.is_terminal():
            return False
        return not (self.resume and status is RunStatus.CANCELLED and not self.resumed)


def plans(
    runs: int, cancel_fraction: float, resume_fraction: float, rng: random.Random
) -> list[Plan]:
    """Each run's plan, drawn from `rng` so that a seed repeats a soak."""
    out = []
    for _ in range(runs):
        cancel = rng.choice(["queued", "running"]) if rng.random() < cancel_fraction else None
        out.append(Plan(cancel, cancel is not None and rng.random() < resume_fraction))
    return out


def rss_mb(pid: int | None) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1) if pid else None
    except psutil.NoSuchProcess:
        return None


class Processes:
    """Every process serve ran (itself and its descendants: the Ray head, the runs' workers
    and engines, the dashboard), noted at each poll by pid and start time, so that one still
    alive after serve stopped is found even when it was re-parented."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], str] = {}

    def note(self, serve_pid: int) -> None:
        try:
            serve = psutil.Process(serve_pid)
            tree = [serve, *serve.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in tree:
            try:
                key = (process.pid, process.create_time())
                self.seen.setdefault(key, " ".join(process.cmdline())[:120])
            except psutil.NoSuchProcess:
                continue

    def left(self, heads: list[Head], grace_s: float = LEFT_GRACE_S) -> list[str]:
        """Those still alive `grace_s` after serve exited, or at the first look that finds
        none: Ray's dashboard subprocesses outlive `eslab serve` by a few seconds (seen in a
        soak), which is no leak."""
        deadline = time.monotonic() + grace_s
        while (alive := self._alive(heads)) and time.monotonic() < deadline:
            time.sleep(1)
        return alive

    def _alive(self, heads: list[Head]) -> list[str]:
        alive = []
        for (pid, started), cmdline in self.seen.items():
            try:
                if psutil.Process(pid).create_time() == started:
                    alive.append(f"{pid} {cmdline}")
            except psutil.NoSuchProcess:
                continue
        known = {int(entry.split()[0]) for entry in alive}
        for head in heads:
            alive += [
                f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}"
                for p in head_processes(head.temp_dir)
                if p.pid not in known
            ]
        return alive


def cancel_unless_ended(store: Store, run_id: int, env: dict[str, str]) -> bool:
    """`eslab cancel` the run; False when it ended before the cancel reached it (a race the
    soak loses now and then, no fault of serve's)."""
    try:
        eslab("cancel", str(run_id), env=env)
        return True
    except StageFailed:
        if store.get_run(run_id).status.is_terminal():
            return False
        raise


def live_ray_jobs(head: Head | None) -> list[str]:
    """The Ray jobs still pending or running on serve's head; a head that cannot be asked
    is named instead, so that the check fails rather than the soak."""
    if head is None:
        return []
    try:
        jobs = RayJobs(head.address).client.list_jobs()
    except (RayUnavailableError, ConnectionError, RuntimeError) as exc:
        return [f"(Ray at {head.address} could not be asked: {exc})"]
    return [j.submission_id for j in jobs if not JobState(str(j.status)).is_terminal()]


def wait_for_note(database: str) -> ServeNote:
    deadline = time.monotonic() + NOTE_DEADLINE_S
    while time.monotonic() < deadline:
        note = read_note(database)
        if note and note.head and note.dashboard_pid:
            return note
        time.sleep(0.5)
    raise RuntimeError(f"serve wrote no note of its head and dashboard in {NOTE_DEADLINE_S} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--cancel-fraction", type=float, default=0.2)
    parser.add_argument(
        "--resume-fraction", type=float, default=0.5, help="of the cancelled runs, resumed"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=None, help="dashboard port (a free one)")
    parser.add_argument("--preset", default="es-conciseness")
    parser.add_argument("--min-steps", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--stall-timeout", type=float, default=1800, help="seconds")
    parser.add_argument("--keep-outputs", action="store_true")
    parser.add_argument("--set", dest="options", action="append", default=[])
    args = parser.parse_args()
    for name in ("cancel_fraction", "resume_fraction"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must be between 0 and 1")
    if args.runs < 1 or args.concurrent < 1:
        parser.error("--runs and --concurrent must be at least 1")
    if not 1 <= args.min_steps <= args.max_steps:
        parser.error("--min-steps must be at least 1 and at most --max-steps")

    out = args.out.resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{out / 'eslab.db'}"
    upgrade(db_url)
    store = Store(db_url)
    database = store.engine.url.render_as_string(hide_password=True)
    roots = os.pathsep.join(filter(None, [str(out), os.environ.get(OUTPUT_ROOTS_SETTING)]))
    env = serve_env(
        db_url, ESLAB_MAX_CONCURRENT_RUNS=str(args.concurrent), **{OUTPUT_ROOTS_SETTING: roots}
    )
    rng = random.Random(args.seed)
    plan = plans(args.runs, args.cancel_fraction, args.resume_fraction, rng)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    processes = Processes()
    with eslab_serve(env, out / "serve.log", args.port) as url:
        note = wait_for_note(database)
        results |= {
            "dashboard": url,
            "dashboard_rss_mb_start": rss_mb(note.dashboard_pid),
            "serve_rss_mb_start": rss_mb(note.serve_pid),
        }
        started = time.monotonic()
        ids: dict[int, Plan] = {}
        for i, p in enumerate(tqdm(plan, desc="queueing", unit="run")):
            steps = rng.randint(args.min_steps, args.max_steps)
            options = [
                *TINY,
                f"max_steps={steps}",
                f"output_dir={out / 'runs' / f'soak-{i}'}",
                f"run_name=soak-{i}",
                *args.options,
            ]
            run_id = submit(args.preset, options, env)
            ids[run_id] = p
            if p.cancel == "queued":
                eslab("cancel", str(run_id), env=env)
                p.cancelled = True
            processes.note(note.serve_pid)
        drive(store, ids, env, processes, note, args)
        results["hours"] = (time.monotonic() - started) / 3600
        first_head = note.head
        note = read_note(database) or note  # a head that died was replaced
        heads = [h for h in {first_head, note.head} if h]
        results |= {
            "dashboard_rss_mb_end": rss_mb(note.dashboard_pid),
            "serve_rss_mb_end": rss_mb(note.serve_pid),
            "ray_jobs_left": live_ray_jobs(note.head),
        }
        processes.note(note.serve_pid)
    exports = [store.export_run(run_id) for run_id in ids]
    resumed = [i for i, p in ids.items() if p.resumed]
    checks = end_checks(
        exports, args.runs, resumed, results["ray_jobs_left"], processes.left(heads)
    )
    ended = sum(e.run.status.is_terminal() for e in exports)
    results |= {
        "runs_per_hour": round(ended / results["hours"], 1),
        "statuses": Counter(e.run.status.value for e in exports),
        "cancels": sum(p.cancelled for p in ids.values()),
        "resumes": len(resumed),
        "processes_seen": len(processes.seen),
        "checks": [asdict(c) for c in checks],
    }
    report(checks, results)
    (out / "soak.json").write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(c.passed for c in checks) else 1


def drive(
    store: Store,
    ids: dict[int, Plan],
    env: dict[str, str],
    processes: Processes,
    note: ServeNote,
    args: argparse.Namespace,
) -> None:
    """Poll the runs until each has ended for good, cancelling those planned once they have
    a checkpoint and resuming those planned once cancelled; stop after --stall-timeout
    seconds in which no run changed (the end checks then name the runs that did not end)."""
    bar = tqdm(total=len(ids), desc="runs", unit="run")
    finished: set[int] = set()
    last, changed = None, time.monotonic()
    while len(finished) < len(ids):
        runs = {i: store.get_run(i) for i in ids if i not in finished}
        for run_id, run in runs.items():
            p = ids[run_id]
            if p.cancel == "running" and not p.cancelled and run.status is RunStatus.RUNNING:
                if store.checkpoints(run_id):
                    p.cancelled = cancel_unless_ended(store, run_id, env)
            elif p.resume and not p.resumed and run.status is RunStatus.CANCELLED:
                eslab("resume", str(run_id), env=env)
                p.resumed = True
            elif p.done_with(run.status):
                finished.add(run_id)
                bar.update(1)
                if not args.keep_outputs and run.status is not RunStatus.FAILED:
                    shutil.rmtree(run.config["output_dir"], ignore_errors=True)
        state = sorted((i, r.status.value, r.step, r.attempt) for i, r in runs.items())
        if state != last:
            last, changed = state, time.monotonic()
        elif time.monotonic() - changed > args.stall_timeout:
            bar.write(f"no run changed in {args.stall_timeout:.0f} s: giving up")
            break
        counts = Counter(r.status.value for r in runs.values())
        bar.set_postfix(dashboard_mb=rss_mb(note.dashboard_pid), **counts)
        processes.note(note.serve_pid)
        time.sleep(POLL_S)
    bar.close()


def report(checks: list, results: dict[str, Any]) -> None:
    rows = [("CHECK", "RESULT", "DETAIL")]
    rows += [(c.name, "pass" if c.passed else "FAIL", c.detail) for c in checks]
    print_table(rows)
    figures = (
        "runs_per_hour",
        "hours",
        "statuses",
        "cancels",
        "resumes",
        "dashboard_rss_mb_start",
        "dashboard_rss_mb_end",
        "serve_rss_mb_start",
        "serve_rss_mb_end",
        "processes_seen",
    )
    print()
    print_table([("FIGURE", "VALUE"), *[(f, str(results[f])) for f in figures]])


if __name__ == "__main__":
    sys.exit(main())
