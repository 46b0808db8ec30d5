"""The product path as a user takes it, on whatever machine this runs (the GPU machine too),
driven through the CLI alone and timed:

1. `eslab db upgrade` of a fresh database, then `eslab serve` (Ray head, scheduler,
   dashboard): until its address file is written and the dashboard answers HTTP 200;
2. `eslab submit PRESET --set max_steps=N`: the run goes queued -> starting engine ->
   running -> succeeded; its metrics, population rows and samples are counted in the
   database, and the "engine started" event says where the engine computed;
3. a second run is submitted and `eslab cancel`ed once its engine is up: the time from the
   cancel to `cancelled`;
4. `eslab export RUN --format html` writes the first run's report; `eslab runs` is kept;
5. serve is stopped with Ctrl-C, as a user stops it.

    python3 bench/product_path.py --out FOLDER [--preset es-conciseness] [--steps 3]
        [--set OPTION=VALUE ...]

Writes FOLDER/product-path.json (every figure), FOLDER/report.html, FOLDER/serve.log and
FOLDER/runs.txt, and prints one line per stage. Exits 1 when a stage fails. The model and
data come from ESLAB_DATA_DIR (or the checkout's data/); the database is FOLDER/eslab.db.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.phases import ENGINE_STARTED, STARTING_ENGINE  # noqa: E402
from jobs.private_files import read_private  # noqa: E402
from jobs.service import DASHBOARD_FILE  # noqa: E402
from jobs.store.status import RunStatus  # noqa: E402
from jobs.store.store import Store  # noqa: E402

ESLAB = [sys.executable, "-m", "app.cli"]
SERVE_DEADLINE_S = 300
RUN_DEADLINE_S = 900


class StageFailed(RuntimeError):
    pass


def eslab(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run([*ESLAB, *args], env=env, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise StageFailed(f"eslab {' '.join(args)} failed: {result.stdout}{result.stderr}")
    return result.stdout


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(what: str, test: Any, deadline_s: float, serve: subprocess.Popen) -> float:
    """Seconds until test() is true; StageFailed at the deadline or when serve exits."""
    start = time.monotonic()
    while not test():
        if serve.poll() is not None:
            raise StageFailed(f"eslab serve exited ({serve.returncode}) while waiting for {what}")
        if time.monotonic() - start > deadline_s:
            raise StageFailed(f"no {what} within {deadline_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - start


def submit(preset: str, options: list[str], env: dict[str, str]) -> int:
    """The run id of a submission, read from the URL that submit prints."""
    out = eslab("submit", preset, *[a for o in options for a in ("--set", o)], env=env)
    url = next(word for word in out.split() if "run=" in word)
    return int(url.rsplit("run=", 1)[1])


def watch(store: Store, run_id: int, serve: subprocess.Popen) -> dict[str, float]:
    """Seconds from submission to each status or phase the run went through, to its end."""
    start, seen = time.monotonic(), {}
    while time.monotonic() - start < RUN_DEADLINE_S:
        if serve.poll() is not None:
            raise StageFailed(f"eslab serve exited ({serve.returncode}) during run {run_id}")
        status = store.get_run(run_id).status
        messages = [e.message for e in store.events(run_id)] if status is RunStatus.RUNNING else []
        names = [STARTING_ENGINE if STARTING_ENGINE in messages else status.value]
        names += [ENGINE_STARTED for m in messages if m.startswith(ENGINE_STARTED)]
        for name in names:
            if name not in seen:
                seen[name] = round(time.monotonic() - start, 1)
                print(f"  run {run_id}: {name} after {seen[name]} s", flush=True)
        if status.is_terminal():
            return seen
        time.sleep(0.5)
    raise StageFailed(f"run {run_id} did not end within {RUN_DEADLINE_S} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="es-conciseness")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--set", dest="options", action="append", default=[])
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{out / 'eslab.db'}"
    env = {
        **os.environ,
        "ESLAB_DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    env.pop("RAY_ADDRESS", None)
    results: dict[str, Any] = {"preset": args.preset, "steps": args.steps, "options": args.options}
    earlier = (read_private(DASHBOARD_FILE) or "").strip()
    if earlier and answers(earlier):
        print(
            f"FAILED: a dashboard already answers at {earlier} (an earlier eslab serve): "
            "stop it first, or serve_up_s would time that one",
            flush=True,
        )
        return 1
    eslab("db", "upgrade", env=env)
    store = Store(db_url)
    log = (out / "serve.log").open("w")
    serve = subprocess.Popen(
        [*ESLAB, "serve"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def dashboard_answers() -> bool:
            url = (read_private(DASHBOARD_FILE) or "").strip()
            return bool(url) and answers(url)

        results["serve_up_s"] = round(
            wait_for("dashboard answering HTTP 200", dashboard_answers, SERVE_DEADLINE_S, serve), 1
        )
        dashboard = (read_private(DASHBOARD_FILE) or "").strip()
        results["dashboard"] = dashboard
        print(f"serve: dashboard {dashboard} answers 200 after {results['serve_up_s']} s")

        first = submit(args.preset, [f"max_steps={args.steps}", *args.options], env)
        results["run"] = {"id": first, "timeline_s": watch(store, first, serve)}
        record = store.export_run(first)
        results["run"] |= {
            "status": record.run.status.value,
            "error": record.run.error,
            "metric_rows": len(record.metrics),
            "population_rows": len(record.population),
            "sample_rows": len(record.samples),
            "steps_recorded": sorted({m["step"] for m in record.metrics}),
            "engine": next(
                (e.message for e in record.events if e.message.startswith(ENGINE_STARTED)), None
            ),
            "eval_reward_mean": [
                (m["step"], m["value"]) for m in record.metrics if m["key"] == "eval/reward/mean"
            ],
        }
        print(f"run {first}: {json.dumps(results['run'], default=str)}", flush=True)
        if record.run.status is not RunStatus.SUCCEEDED or not record.population:
            raise StageFailed(f"run {first} ended {record.run.status.value}: {record.run.error}")

        second = submit(args.preset, [f"max_steps={args.steps + 100}", *args.options], env)
        wait_for(
            "engine start of the second run",
            lambda: any(e.message.startswith(ENGINE_STARTED) for e in store.events(second)),
            RUN_DEADLINE_S,
            serve,
        )
        cancelled_at = time.monotonic()
        eslab("cancel", str(second), env=env)
        wait_for(
            "end of the cancelled run",
            lambda: store.get_run(second).status.is_terminal(),
            RUN_DEADLINE_S,
            serve,
        )
        results["cancel"] = {
            "id": second,
            "status": store.get_run(second).status.value,
            "seconds": round(time.monotonic() - cancelled_at, 1),
            "step_at_end": store.get_run(second).step,
        }
        print(f"cancel: {results['cancel']}", flush=True)
        if results["cancel"]["status"] != RunStatus.CANCELLED.value:
            raise StageFailed(f"run {second} ended {results['cancel']['status']}, not cancelled")

        report = out / "report.html"
        eslab("export", str(first), "--format", "html", "--out", str(report), env=env)
        results["report_bytes"] = report.stat().st_size
        (out / "runs.txt").write_text(eslab("runs", env=env))
        results["ok"] = True
    except StageFailed as exc:
        results["ok"], results["failure"] = False, str(exc)
        print(f"FAILED: {exc}", flush=True)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
        results["serve_exit"] = serve.wait()
        log.close()
        (out / "product-path.json").write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps(results, indent=2, default=str))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
