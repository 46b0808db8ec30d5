"""Many viewers on the dashboard while a real run trains: how long until each viewer is shown
a new step, what the viewers cost the run, and the dashboard's CPU and memory.

    PYTHONPATH=$PWD .venv/bin/python bench/dashboard_load.py --viewers 20 --minutes 10

On a temporary SQLite database it starts the dashboard (Streamlit, as `eslab serve` runs it,
without Ray: the run trains in the foreground with `eslab train`, which records it in the
same database) and a real run of the es-conciseness preset on the default model with a short
token budget. The run's first steps go with no viewer; then `--viewers` sessions open, three
in four on the run's Run page and one in four on the Runs page, each speaking Streamlit's
websocket protocol (bench/streamlit_viewer.py), beside `--browsers` real Chromium pages of
the Run page; after `--minutes` they close and the run takes a few more steps alone.

A step is committed when a poll of the database (every POLL_S) first sees it; it appears for
a viewer when a message showing that step count arrives. Step time and tokens/s with viewers
are compared with the steps before and after them, with none."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from bench.streamlit_viewer import Viewer
from engine import metrics as mk
from engine.paths import PROJECT_ROOT
from jobs.service import dashboard_command, dashboard_env
from jobs.store.migrate import upgrade
from tests.app.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, free_port

POLL_S = 0.1
SAMPLE_S = 15.0
DEFAULT_MODEL = PROJECT_ROOT / "data/models/smollm2-135m-instruct"


class Steps:
    """When each step of the run was first seen committed, from a poll of its database."""

    def __init__(self, db: Path, run_id: int) -> None:
        self.db, self.run_id = db, run_id
        self.committed: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        con = sqlite3.connect(self.db, timeout=30)
        last = -1
        while not self.stop.is_set():
            (step,) = con.execute("SELECT step FROM runs WHERE id = ?", (self.run_id,)).fetchone()
            now = time.time()
            for s in range(last + 1, step + 1):
                self.committed.setdefault(s, now)
            last = max(last, step)
            time.sleep(POLL_S)

    def latest(self) -> int:
        return max(self.committed, default=0)

    def wait_for(self, step: int, process: subprocess.Popen) -> None:
        while self.latest() < step:
            if process.poll() is not None:
                sys.exit(f"the run ended (exit {process.returncode}) before step {step}")
            time.sleep(1)


class Seen:
    """When each viewer was first shown each step count (a count shows all steps up to it)."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], dict[int, float]] = {}
        self.lock = threading.Lock()

    def recorder(self, page: str, viewer: int) -> Callable[[int, float], None]:
        seen = self.first.setdefault((page, viewer), {})

        def record(step: int, at: float) -> None:
            with self.lock:
                for s in range(step, 0, -1):
                    if s in seen:
                        break
                    seen[s] = at

        return record

    def latencies(self, page: str, committed: dict[int, float], since: float) -> list[float]:
        """Seconds from commit to first sight of each step committed after `since`."""
        with self.lock:
            return [
                at - committed[s]
                for (p, _), seen in self.first.items()
                if p == page
                for s, at in seen.items()
                if s in committed and committed[s] > since
            ]


def percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return f"{len(values)} samples"
    q = statistics.quantiles(values, n=20)
    return f"p50 {statistics.median(values):.2f} s  p95 {q[18]:.2f} s  ({len(values)} samples)"


def start_dashboard(db_url: str, port: int, log: Path) -> subprocess.Popen:
    env = {**dashboard_env(), "ESLAB_DATABASE_URL": db_url, "PYTHONPATH": str(PROJECT_ROOT)}
    process = subprocess.Popen(
        dashboard_command("127.0.0.1", port),
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return process
        except OSError:
            time.sleep(0.5)
    sys.exit("the dashboard did not start: " + log.read_text())


def start_run(db_url: str, args: argparse.Namespace, out: Path, log: Path) -> subprocess.Popen:
    """A real run of the es-conciseness preset, recorded in the database, in the foreground."""
    settings = {
        "model": str(args.model),
        "max_steps": 10_000,  # ended by this benchmark
        "max_tokens": args.max_tokens,
        "population_size": args.population,
        "eval_strategy": "no",
        "save_strategy": "no",
        "output_dir": str(out),
    }
    command = [str(Path(sys.executable).with_name("eslab")), "train", "es-conciseness"]
    for name, value in settings.items():
        command += ["--set", f"{name}={value}"]
    env = {
        **os.environ,
        "ESLAB_DATABASE_URL": db_url,
        "PYTHONPATH": str(PROJECT_ROOT),
        "ESLAB_INPUT_ROOTS": str(Path(args.model).resolve().parent),
        "ESLAB_OUTPUT_ROOTS": str(out.parent),
    }
    return subprocess.Popen(
        command,
        env=env,
        cwd=PROJECT_ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def first_run(db: Path, process: subprocess.Popen) -> int:
    while True:
        if process.poll() is not None:
            sys.exit(f"the run ended (exit {process.returncode}) before it was recorded")
        try:
            row = sqlite3.connect(db, timeout=30).execute("SELECT min(id) FROM runs").fetchone()
        except sqlite3.OperationalError:
            row = (None,)
        if row[0] is not None:
            return row[0]
        time.sleep(1)


def cpu_per_minute(samples: Sequence[tuple[float, ...]], since: float) -> float:
    """CPU-seconds a minute between the first sample at or after `since` and the last, from
    samples that start (time, CPU-seconds, ...)."""
    start = next(s for s in samples if s[0] >= since)
    end = samples[-1]
    return 60 * (end[1] - start[1]) / max(end[0] - start[0], 1e-9)


class Usage:
    """The dashboard process's CPU-seconds and resident memory, sampled as it goes."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, float, float]] = []  # (time, cpu seconds, rss MB)
        self.sample()

    def sample(self) -> None:
        cpu = self.process.cpu_times()
        rss = self.process.memory_info().rss / 2**20
        self.samples.append((time.time(), cpu.user + cpu.system, rss))

    def cpu_per_minute(self, since: float) -> float:
        return cpu_per_minute(self.samples, since)


class ClientUsage:
    """CPU-seconds of the viewers' side: this process (the websocket viewers, and the step
    poll) and its other descendants (Playwright's driver and Chromium), not the dashboard or
    the run. On a real server the viewers' rendering happens on their own machines; here it
    takes the run's cores too, so the figure says how much of the slowdown is theirs."""

    def __init__(self, server_pids: set[int]) -> None:
        self.server_pids = server_pids
        self.cpu: dict[int, float] = {}  # pid -> the most CPU-seconds it was seen with
        self.samples: list[tuple[float, float]] = []  # (time, viewers' CPU-seconds)
        self.sample()

    def sample(self) -> None:
        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                if process.pid in self.server_pids or process.ppid() in self.server_pids:
                    continue
                times = process.cpu_times()
            except psutil.Error:
                continue
            self.cpu[process.pid] = max(self.cpu.get(process.pid, 0.0), times.user + times.system)
        self.samples.append((time.time(), sum(self.cpu.values())))

    def cpu_per_minute(self, since: float) -> float:
        return cpu_per_minute(self.samples, since)


def step_figures(db: Path, run_id: int, steps: set[int]) -> str:
    """Median step time and tokens/s over `steps`, from the run's own metrics, and each
    step's time (a shared machine's other work shows as outliers)."""
    con = sqlite3.connect(db, timeout=30)

    def values(key: str) -> list[float]:
        rows = con.execute(
            "SELECT step, value FROM metrics WHERE run_id = ? AND key = ? ORDER BY step",
            (run_id, key),
        ).fetchall()
        return [v for s, v in rows if s in steps] or [float("nan")]

    times = values(mk.time_key("step"))
    each = " ".join(f"{t:.0f}" for t in times)
    return (
        f"step {statistics.median(times):6.2f} s  tokens/s "
        f"{statistics.median(values(mk.TOKENS_PER_SECOND)):6.1f}  (medians of {len(steps)} "
        f"steps; each: {each} s)"
    )


def browse(
    port: int, run_id: int, n: int, seen: Seen, stop: threading.Event, ready: threading.Event
) -> None:
    """`n` Chromium pages of the Run page; each reports the step counts it displays."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pages = []
        for i in range(n):
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)  # a loaded 2-core machine is slow to render
            page.goto(f"http://127.0.0.1:{port}/run?run={run_id}", wait_until="commit")
            pages.append((page, seen.recorder("chromium", i)))
        ready.set()
        shown = "() => [...document.querySelectorAll('[data-testid=stMetricValue]')]" + (
            ".map(e => e.innerText).find(t => /^\\d+ \\//.test(t)) || ''"
        )
        while not stop.is_set():
            for page, record in pages:
                text = page.evaluate(shown)
                if text:
                    record(int(text.split("/")[0]), time.time())
            time.sleep(0.25)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--viewers", type=int, default=20, help="websocket sessions")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long they view")
    parser.add_argument("--browsers", type=int, default=1, help="Chromium pages besides")
    parser.add_argument(
        "--alone-steps", type=int, default=3, help="steps with no viewer, before and after"
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="the run's token budget")
    parser.add_argument(
        "--population",
        type=int,
        default=4,
        help="the run's population (the preset's 8 took 40-100 s a step on 2 cores)",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = parser.parse_args()
    if not args.model.is_dir():
        sys.exit(f"--model {args.model}: not a folder (the default model is fetched there)")

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db = tmp / "eslab.db"
        db_url = f"sqlite:///{db}"
        upgrade(db_url)
        port = free_port()
        dashboard = start_dashboard(db_url, port, tmp / "dashboard.log")
        run = start_run(db_url, args, tmp / "out", tmp / "run.log")
        try:
            measure(args, db, port, dashboard, run)
        except SystemExit:
            print((tmp / "run.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            for process in (run, dashboard):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def measure(
    args: argparse.Namespace,
    db: Path,
    port: int,
    dashboard: subprocess.Popen,
    run: subprocess.Popen,
) -> None:
    run_id = first_run(db, run)
    steps = Steps(db, run_id)
    print(f"dashboard on port {port}, run {run_id} training (real engine); waiting for steps")
    steps.wait_for(1 + args.alone_steps, run)  # step 1 includes the engine's warm-up
    alone_before = set(range(2, steps.latest() + 1))
    print(f"{len(alone_before)} steps with no viewer; opening {args.viewers} viewers")

    usage = Usage(dashboard.pid)
    server = {dashboard.pid, run.pid} | {
        c.pid for p in (dashboard, run) for c in psutil.Process(p.pid).children(recursive=True)
    }
    clients = ClientUsage(server)
    seen = Seen()
    opened = time.time()
    stop_browsers, browsers_ready = threading.Event(), threading.Event()
    loop_ready = threading.Event()
    viewers: list[Viewer] = []
    box: dict[str, asyncio.Event] = {}

    def run_viewers() -> None:
        async def go() -> None:
            box["stop"] = asyncio.Event()
            box["loop"] = asyncio.get_running_loop()
            loop_ready.set()
            for i in range(args.viewers):
                page, query = ("", "") if i % 4 == 3 else ("run", f"run={run_id}")
                viewers.append(
                    Viewer(f"ws://127.0.0.1:{port}", page, query, seen.recorder(page or "runs", i))
                )
            await asyncio.gather(*(v.run(box["stop"]) for v in viewers))

        asyncio.run(go())

    threads = [threading.Thread(target=run_viewers, daemon=True)]
    if args.browsers:
        threads.append(
            threading.Thread(
                target=browse,
                args=(port, run_id, args.browsers, seen, stop_browsers, browsers_ready),
                daemon=True,
            )
        )
    for t in threads:
        t.start()
    loop_ready.wait()
    stop_views = box["stop"]
    warm = opened + 30  # steps committed in the first seconds wait for the pages' first load
    first_loaded = steps.latest()
    end = opened + 60 * args.minutes
    while time.time() < end:
        time.sleep(SAMPLE_S)
        usage.sample()
        clients.sample()
        load = os.getloadavg()
        shown = {p: percentiles(seen.latencies(p, steps.committed, warm)) for p in ("run", "runs")}
        print(
            f"{(time.time() - opened) / 60:5.1f} min  step {steps.latest():3d}  "
            f"run page {shown['run']}  runs page {shown['runs']}  "
            f"dashboard {usage.samples[-1][2]:.0f} MB "
            f"{usage.cpu_per_minute(opened):.1f} CPU-s/min  viewers' side "
            f"{clients.cpu_per_minute(opened):.1f} CPU-s/min  load {load[0]:.2f}",
            flush=True,
        )
    box["loop"].call_soon_threadsafe(stop_views.set)
    stop_browsers.set()
    for t in threads:
        t.join(60)
    closed = time.time()
    with_viewers = {  # steps that began and ended with the viewers on
        s for s in range(first_loaded + 2, steps.latest() + 1) if steps.committed[s] <= closed
    }
    print(
        f"\n{args.viewers} websocket viewers ({sum(1 for i in range(args.viewers) if i % 4 != 3)}"
        f" on the Run page, the rest on Runs) and {args.browsers} Chromium page(s), "
        f"{args.minutes:g} min, real run (es-conciseness, population {args.population}, "
        f"max_tokens {args.max_tokens})"
    )
    for page in ("run", "runs", "chromium"):
        print(
            f"new step shown, {page:<8}: {percentiles(seen.latencies(page, steps.committed, warm))}"
        )
    rss = [s[2] for s in usage.samples]
    print(
        f"dashboard: {usage.cpu_per_minute(opened):.1f} CPU-s/min; memory {rss[0]:.0f} MB before "
        f"the viewers, {rss[len(rss) // 2]:.0f} MB halfway, {rss[-1]:.0f} MB at the end, "
        f"max {max(rss):.0f} MB"
    )
    print(
        f"viewers' side (the websocket viewers and Chromium, on this machine): "
        f"{clients.cpu_per_minute(opened):.1f} CPU-s/min"
    )
    dropped = sum(v.errors for v in viewers)
    print(f"viewer reconnects: {dropped}; load average {os.getloadavg()}", flush=True)
    # the viewers' figures are out; the run's own, alone again, come after a few more steps
    print(f"run with viewers: {step_figures(db, run_id, with_viewers)}", flush=True)
    after = steps.latest()
    steps.wait_for(after + 1 + args.alone_steps, run)
    alone_after = set(range(after + 2, steps.latest() + 1))  # the first may have overlapped
    steps.stop.set()
    print(f"run alone       : {step_figures(db, run_id, alone_before | alone_after)}")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
