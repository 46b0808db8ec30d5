"""`eslab presets`: the ready-made runs, what each is for and what it needs first (the
preset files' opening comments, as the New run form shows them)."""

from __future__ import annotations

import argparse
import textwrap


def add_commands(commands: argparse._SubParsersAction) -> None:
    presets = commands.add_parser(
        "presets", help="list the ready-made runs (eslab train NAME), what each is for and needs"
    )
    presets.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    from engine.presets import preset_info, preset_names

    for name in preset_names():
        info = preset_info(name)
        print(name)
        lines = [info.purpose, *(f"Needs {need}" for need in info.needs)]
        if info.data_command:
            lines.append(f"Data first: {info.data_command}")
        for line in lines:
            print(textwrap.fill(line, 96, initial_indent="  ", subsequent_indent="    "))
    return 0
