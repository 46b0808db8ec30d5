"""`eslab serve`: Ray (local head or RAY_ADDRESS), the scheduler and the dashboard."""

from __future__ import annotations

import argparse

from app.cli.common import DASHBOARD_PORT, check_ray_address, port, print_error


def add_commands(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="start Ray, the scheduler and the dashboard on http://127.0.0.1:8501"
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind: 127.0.0.1 (default) is this machine only; "
        "0.0.0.0 shares the dashboard (set ESLAB_AUTH_FILE for logins)",
    )
    serve.add_argument("--port", type=port, default=DASHBOARD_PORT)
    serve.add_argument(
        "--max-concurrent-runs",
        type=int,
        metavar="N",
        help="runs at once (default: ESLAB_MAX_CONCURRENT_RUNS or 1)",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Ray (local head or RAY_ADDRESS), the scheduler and the dashboard (jobs/service.py)."""
    from app.auth import auth_path, load_users
    from jobs.scheduler import SchedulerSettings
    from jobs.service import ServiceError, serve

    check_ray_address()
    if (path := auth_path()) is not None:  # a bad auth file stops serve before Ray starts
        print(f"logins required: {len(load_users(path))} user(s) in {path}", flush=True)
    overrides = {}
    if args.max_concurrent_runs is not None:
        overrides["max_concurrent_runs"] = args.max_concurrent_runs
    try:
        return serve(args.host, args.port, SchedulerSettings.from_env(**overrides))
    except ServiceError as exc:
        print_error(str(exc))
        return 2
