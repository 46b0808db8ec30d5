"""ES Lab's full-rank iteration against ES at Scale's own, side by side on one GPU.

    python3 bench/gpu/reference.py --reference SNAPSHOT_DIR MODEL_DIR [--population 32]
        [--prompts 8] [--max-tokens 128] [--steps 2] [--engines 1] [--budget 570]
        [--reference-executor ray] [--sides eslab reference] [--json FILE]

SNAPSHOT_DIR is a checkout of ES at Scale (VsonicV/es-at-scale; tested at 574a9d1): its
modules are imported from there, never copied into this repository, and the patches it needs
on this machine's vLLM (written for 0.11) are applied at run time and listed in the output
and the JSON (bench/gpu/reference_shims.py). ES at Scale's side builds its trainer with its
own engine launch (a Ray actor in a placement group, vLLM with its worker extension) and calls
its train_step once an iteration, as its fit loop does; ES Lab's side is
bench/gpu/utilization.py's full-rank row (`--engines` engines on the GPU). Both take the same
prompts: `--prompts` countdown puzzles of ES at Scale's kind and raw prompt text, written with
a seed by engine.data.countdown_es_at_scale (ES at Scale's own data is not needed), every one
for every member; the same population and token budget (greedy, as both do); one warm-up
iteration, then `--steps` timed ones. members/s = population / mean step seconds.

Each side runs in its own process (ES Lab first) with its own log, next to the JSON, and its
own timeout: an even share of `--budget` still left when it starts (570 s: the whole command
within the GPU machine's 600 s a call; ES Lab ending early leaves its rest to ES at Scale).
The JSON is written after each side, with a failed side's error, and a side not run this
time is kept from an earlier file of the same settings (so the sides may also run as two
commands). If ES at Scale's engine fails to start with its own vLLM executor ("ray"), it is
tried once more with "uni" (listed as a patch, the first error kept). Exit 0 when ES Lab's
side measured its step, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.gpu.reference_shims import SnapshotError, check_snapshot  # noqa: E402
from engine.config.schema import AUTO  # noqa: E402

SIDES = ("eslab", "reference")
TITLES = {"eslab": "ES Lab", "reference": "ES at Scale"}
SETTINGS = ("model", "population", "prompts", "max_tokens", "steps", "engines")
LOG_TAIL_LINES = 40
KILL_GRACE_S = 20


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model folder (bench/gpu/make_models.py writes them)")
    parser.add_argument(
        "--reference", required=True, type=Path, help="folder of an ES at Scale snapshot"
    )
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8, help="prompts a member")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="timed iterations after 1 warm-up")
    parser.add_argument(
        "--engines",
        type=engine_count,
        default=1,
        help="ES Lab's full-rank engines, or auto: those a run gets by default "
        "(engine/backends/arrangement.py; --memory is then the card's share for all of them)",
    )
    parser.add_argument(
        "--engines-per-gpu", type=int, default=0, help="as utilization.py (0: all on one GPU)"
    )
    parser.add_argument(
        "--memory", type=float, default=0.4, help="ES Lab's share of the GPU's memory"
    )
    parser.add_argument("--max-model-len", type=int, default=1024, help="ES Lab's engines")
    parser.add_argument(
        "--budget",
        type=float,
        default=570.0,
        help="seconds for all sides (each gets an even share of what is left when it starts)",
    )
    parser.add_argument(
        "--reference-executor",
        choices=("ray", "uni"),
        default="ray",
        help="vLLM executor of ES at Scale's engine: ray (its own; on failure it is tried "
        "once more with uni) or uni (the model in its engine actor)",
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--json", type=Path)
    # a side's own process (run by this script)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    # utilization.py's engines: one GPU each; independent members, as the reference draws them
    parser.set_defaults(tensor_parallel_size=1, antithetic=False)
    args = parser.parse_args(argv)
    for name in ("population", "prompts", "max_tokens", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"model: {args.model} is not a model folder (it has no config.json)")
    try:
        check_snapshot(args.reference)
    except SnapshotError as exc:
        parser.error(f"--reference: {exc}")
    return args


def engine_count(text: str) -> int | str:
    """--engines: a whole number from 1, or auto."""
    if text.strip().lower() == AUTO:
        return AUTO
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, or auto; got {text!r}")
    return int(text)


def side_timeout(budget: float, spent: float, sides_left: int) -> float:
    """An even share of the budget still left (a side that ends early leaves its rest to
    the sides after it)."""
    return max(budget - spent, 0.0) / sides_left


def settings(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in SETTINGS}


def measured_step_s(side: dict) -> float | None:
    """Mean seconds of a side's timed iterations: ES Lab's own mean, or ES at Scale's
    iterations after the first (the warm-up); None when none was timed."""
    if isinstance(side.get("step_s"), int | float):
        return float(side["step_s"])
    timed = [i["s"] for i in side.get("iterations", [])[1:]]
    return statistics.mean(timed) if timed else None


def summarize(results: dict) -> dict:
    """members/s of each side that measured its step, and ES Lab's over ES at Scale's."""
    population = results["settings"]["population"]
    for name in SIDES:
        side = results.get(name)
        if side is None:
            continue
        step = measured_step_s(side)
        side["members_per_s"] = population / step if step else None
        if step and "iterations" in side:
            side["step_s"] = step
            side["tokens"] = statistics.mean(i["tokens"] for i in side["iterations"][1:])
    rates = [results.get(n, {}).get("members_per_s") for n in SIDES]
    results["ratio"] = rates[0] / rates[1] if all(rates) else None
    return results


def load_previous(path: Path | None, current: dict) -> dict:
    """An earlier file's results when it measured the same settings (its sides are kept
    where this run does not repeat them); otherwise a new record."""
    if path is not None and path.is_file():
        try:
            previous = json.loads(path.read_text())
        except json.JSONDecodeError:
            previous = None
        if isinstance(previous, dict) and previous.get("settings") == current:
            return previous
    return {"settings": current}


def figure(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(results: dict) -> str:
    s = results["settings"]
    lines = [
        f"{s['model']}: population {s['population']}, {s['prompts']} prompts a member, "
        f"{s['max_tokens']} tokens, {s['steps']} timed iterations after 1 warm-up",
        f"{'side':<22}{'start s':>9}{'step s':>9}{'members/s':>11}{'tokens/step':>13}",
    ]
    for name in SIDES:
        side = results.get(name)
        if side is None:
            continue
        title = TITLES[name] + (f" ({engines_shown(s, side)} engine(s))" if name == "eslab" else "")
        lines.append(
            f"{title:<22}{figure(side.get('start_s'), 1):>9}{figure(side.get('step_s')):>9}"
            f"{figure(side.get('members_per_s')):>11}{figure(side.get('tokens'), 0):>13}"
        )
        if side.get("error"):
            lines.append(f"  failed: {side['error']}")
    lines.append(f"ES Lab / ES at Scale members/s: {figure(results.get('ratio'))}")
    patches = results.get("reference", {}).get("patches", [])
    if patches:
        lines.append("patches applied to ES at Scale at run time:")
        lines += [f"  - {p}" for p in patches]
    return "\n".join(lines)


def engines_shown(settings: dict, side: dict) -> str:
    """ES Lab's engines as the table shows them: the number, or auto and what it chose."""
    if settings["engines"] != AUTO:
        return str(settings["engines"])
    return f"auto: {side.get('engines', '?')}"


def write(results: dict, path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))


def stop(process: subprocess.Popen) -> None:
    """End a side's process group (the side, its Ray cluster and engines): TERM, then KILL."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


def run_side(name: str, argv: Sequence[str], data: Path, stem: Path, timeout: float) -> dict:
    """One side in its own process and session, its output in STEM-NAME.log (its record
    passes through STEM-NAME.record); the record, with rc, wall_s, log and, where it
    failed, error and the log's tail."""
    out = stem.with_name(f"{stem.name}-{name}.record")
    log = stem.with_name(f"{stem.name}-{name}.log")
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    cmd += ["--side", name, "--side-out", str(out), "--data", str(data)]
    print(f"--- {TITLES[name]}: {' '.join(cmd)}\n    log: {log}", flush=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        try:
            rc: int | None = process.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop(process)
            rc, timed_out = process.returncode, True
    record = {}
    if out.is_file():
        try:
            record = json.loads(out.read_text())
        except json.JSONDecodeError as exc:
            record = {"error": f"unreadable side record {out}: {exc}"}
    record |= {"rc": rc, "wall_s": time.perf_counter() - start, "log": str(log)}
    if timed_out:
        record["error"] = f"stopped after the {timeout:.0f} s timeout" + (
            f" (its last error: {record['error']})" if record.get("error") else ""
        )
    elif rc != 0 and not record.get("error"):
        record["error"] = f"exit status {rc}"
    tail = log_tail(log)
    if record.get("error"):
        record["log_tail"] = tail
    print(tail, flush=True)
    return record


def write_puzzles(prompts: int) -> Path:
    """The shared prompts: `prompts` seeded countdown puzzles (countdown.json and
    train.parquet) in a new folder of the data folder's cache (a run's train_file must lie
    in the data folder)."""
    from engine.data.countdown_es_at_scale import generate_countdown_es_at_scale
    from engine.paths import data_dir

    cache = data_dir() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="reference-bench-", dir=cache))
    generate_countdown_es_at_scale(folder, n_train=prompts, n_test=1)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.side:
        from bench.gpu.reference_sides import run_side as run_own_side

        return run_own_side(args, args.side_out)
    results = load_previous(args.json, settings(args))
    results["reference_dir"] = str(args.reference.resolve())
    data = write_puzzles(args.prompts)
    stem = args.json.with_suffix("") if args.json else data / "reference"
    stem.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    todo = [name for name in SIDES if name in args.sides]
    for done, name in enumerate(todo):
        timeout = side_timeout(args.budget, time.perf_counter() - start, len(todo) - done)
        results[name] = run_side(name, argv, data, stem, timeout)
        write(summarize(results), args.json)
    for name in ("card", "vllm", "python"):
        found = [results[s][name] for s in SIDES if name in results.get(s, {})]
        results[name] = found[0] if found else None
    write(summarize(results), args.json)
    print(render(results), flush=True)
    return 0 if results.get("eslab", {}).get("members_per_s") else 1


if __name__ == "__main__":
    sys.exit(main())
