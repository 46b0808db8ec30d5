"""`eslab presets`: the ready-made runs, what each is for and what it needs first (the
preset files' opening comments, as the New run form shows them), and whether its model folder
and datasets are where a run would look (`data/...` in the data folder, ESLAB_DATA_DIR), and
the sweep that tunes it, for the presets meant to learn on the default model."""

from __future__ import annotations

import argparse
import textwrap


def add_commands(commands: argparse._SubParsersAction) -> None:
    presets = commands.add_parser(
        "presets", help="list the ready-made runs (eslab train NAME), what each is for and needs"
    )
    presets.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    from engine.presets import (
        load_preset,
        missing_files,
        preset_info,
        preset_names,
        tuned_presets,
    )

    tuned = tuned_presets()
    for name in preset_names():
        info = preset_info(name)
        print(name)
        lines = [info.purpose, *(f"Needs {need}" for need in info.needs)]
        if info.data_command:
            lines.append(f"Data first: {info.data_command}")
        if name in tuned:
            lines.append(
                f"Tuned by: eslab sweep {name} --space {name} (docs/sweeps.md, Tuning the presets)"
            )
        missing = missing_files(load_preset(name))
        lines += [f"Missing {m.option} {m.named} (looked for at {m.where})" for m in missing]
        if not missing:
            lines.append("Ready: its model and datasets are there")
        for line in lines:
            # paths stay whole, to be copied
            print(
                textwrap.fill(
                    line,
                    96,
                    initial_indent="  ",
                    subsequent_indent="    ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
    return 0
