"""`eslab serve`: Ray (local head or RAY_ADDRESS), the scheduler and the dashboard.

Without ESLAB_AUTH_FILE every visitor of the dashboard is an editor, who can launch runs:
fine on loopback, where only this machine's users reach it, and refused on any other
address unless `--insecure-no-login` says the operator means it. Ray runs in token mode
(engine.backends.ray_auth) unless `--insecure-ray-no-token` says the operator means otherwise."""

from __future__ import annotations

import argparse
import sys

from app.cli.common import DASHBOARD_PORT, check_ray_address, port, print_error
from engine.backends.ray_auth import NO_TOKEN_FLAG

NO_LOGIN_FLAG = "--insecure-no-login"


def add_commands(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="start Ray, the scheduler and the dashboard on http://127.0.0.1:8501"
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind: 127.0.0.1 (default) is this machine only; any other address "
        "(0.0.0.0 shares the dashboard) needs logins: set ESLAB_AUTH_FILE",
    )
    serve.add_argument("--port", type=port, default=DASHBOARD_PORT)
    serve.add_argument(
        "--max-concurrent-runs",
        type=int,
        metavar="N",
        help="runs at once (default: ESLAB_MAX_CONCURRENT_RUNS or 1)",
    )
    serve.add_argument(
        NO_LOGIN_FLAG,
        action="store_true",
        help="serve a non-loopback --host without ESLAB_AUTH_FILE: everyone who can reach the "
        "port is an editor who can launch, cancel and delete runs",
    )
    serve.add_argument(
        NO_TOKEN_FLAG,
        action="store_true",
        help="run Ray without token authentication (RAY_AUTH_MODE=disabled, or a RAY_ADDRESS "
        "cluster that takes jobs without a token): anyone who can reach Ray's ports can run "
        "code as this user",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Ray (local head or RAY_ADDRESS), the scheduler and the dashboard (jobs/service.py)."""
    from app.auth import auth_path, load_users

    path = auth_path()
    if path is not None:  # a bad auth file stops serve before Ray starts
        print(f"logins required: {len(load_users(path))} user(s) in {path}", flush=True)
    elif not _open_dashboard_allowed(args.host, args.insecure_no_login):
        return 2

    from engine.backends.ray_auth import RayAuthError
    from engine.data.uploads import max_upload_mb
    from jobs.ray_head import ServiceError
    from jobs.scheduler import SchedulerSettings
    from jobs.service import serve, trusted_proxies

    check_ray_address()
    overrides = {}
    if args.max_concurrent_runs is not None:
        overrides["max_concurrent_runs"] = args.max_concurrent_runs
    try:  # a malformed ESLAB_* setting stops serve here, before Ray starts
        settings = SchedulerSettings.from_env(**overrides)
        max_upload_mb()
        trusted_proxies()
    except ValueError as exc:
        print_error(str(exc))
        return 2
    if args.insecure_ray_no_token:
        print(
            f"eslab: WARNING: Ray without token authentication ({NO_TOKEN_FLAG}): anyone who "
            "can reach its ports can run code as this user",
            file=sys.stderr,
            flush=True,
        )
    try:
        return serve(args.host, args.port, settings, ray_token=not args.insecure_ray_no_token)
    except (ServiceError, RayAuthError) as exc:
        print_error(str(exc))
        return 2


def _open_dashboard_allowed(host: str, insecure_no_login: bool) -> bool:
    """Whether a dashboard without logins may bind `host`; says why not (or warns) on
    stderr. Checked before the database, Ray or Streamlit start, so a refusal is instant."""
    from app.auth import ENV
    from engine.hosts import is_loopback

    if is_loopback(host):
        return True
    if insecure_no_login:
        print(
            f"eslab: WARNING: serving {host} without logins ({NO_LOGIN_FLAG}): everyone who "
            "can reach this port is an editor and can launch runs as this user; set "
            f"{ENV} to require logins",
            file=sys.stderr,
            flush=True,
        )
        return True
    print_error(
        f"--host {host} is reachable from other machines and {ENV} is not set, so every "
        "visitor would be an editor who can launch runs. Create users with "
        "`eslab users add NAME --role editor --file users.yaml` (and `--role viewer` for "
        f"those who only look), then start with `{ENV}=users.yaml eslab serve --host "
        f"{host}`; or serve 127.0.0.1 only (the default); or pass {NO_LOGIN_FLAG} to "
        "share it without logins anyway"
    )
    return False
