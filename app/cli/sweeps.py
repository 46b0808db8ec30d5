"""`eslab sweep | sweeps`: hyperparameter sweeps, whose runs the scheduler of `eslab serve`
queues and runs (jobs/sweeps/driver.py); `eslab cancel --sweep` and `eslab export --sweep`
are in runs.py and export.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.common import (
    add_set_option,
    load_config,
    open_store,
    print_error,
    print_table,
    sweep_url,
)

if TYPE_CHECKING:
    from engine.config import RunConfig


def add_commands(commands: argparse._SubParsersAction) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="start a sweep: runs of one configuration over a search space (docs/sweeps.md)",
    )
    sweep.add_argument("config", help="the base run configuration: a YAML file or a preset name")
    sweep.add_argument(
        "--space",
        metavar="SPACE.yaml",
        help="the search: method, parameters, objective, budget; a YAML file or the name of one "
        "in engine/presets/sweeps (the presets' tuning, e.g. es-conciseness, and seeds)",
    )
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="OPTION=A,B,C",
        help="sweep OPTION over these values (repeatable; alone, the method is grid)",
    )
    sweep.add_argument("--method", choices=("grid", "random", "tpe"), help="overrides the space's")
    sweep.add_argument("--budget", help="how many runs (overrides the space's)")
    sweep.add_argument("--parallel", help="runs of the sweep at once (overrides the space's)")
    sweep.add_argument(
        "--objective",
        metavar="METRIC[:max|min]",
        help="the metric that ranks the runs, e.g. eval/reward/mean:max (overrides the space's)",
    )
    sweep.add_argument("--name", help="the sweep's name; its runs are NAME-t001, NAME-t002, ...")
    sweep.add_argument(
        "--tag", action="append", default=[], help="label the sweep's runs (repeatable)"
    )
    add_set_option(sweep, "change an option of the base configuration (repeatable)")
    sweep.set_defaults(func=cmd_sweep)
    sweeps = commands.add_parser("sweeps", help="list sweeps: status, runs and the best so far")
    sweeps.add_argument("--limit", type=int, default=20)
    sweeps.set_defaults(func=cmd_sweeps)


def space_file(text: str) -> str:
    """A space file, or the name of a space that ships in engine/presets/sweeps when no such
    file exists (as CONFIG takes a preset's name)."""
    from engine.presets import sweep_space_names, sweep_space_path

    if not Path(text).exists() and text in sweep_space_names():
        return str(sweep_space_path(text))
    return text


def space_mapping(args: argparse.Namespace, base: RunConfig) -> dict[str, Any]:
    """The space file's mapping with the command line's options put in: each --grid option
    replaces the file's parameter of that name, the other options the file's keys."""
    from engine.config.yaml_io import read_yaml_file
    from jobs.sweeps.spec import SweepSpecError, grid_option

    mapping: dict[str, Any] = dict(read_yaml_file(space_file(args.space))) if args.space else {}
    if args.grid:
        parameters = dict(mapping.get("parameters") or {})
        for text in args.grid:
            parameter = grid_option(text, base)
            parameters[parameter.name] = parameter.to_dict()
        mapping["parameters"] = parameters
    given = {
        "method": args.method,
        "budget": args.budget,
        "parallel": args.parallel,
        "objective": args.objective,
    }
    mapping.update({k: v for k, v in given.items() if v is not None})
    if "objective" not in mapping:
        raise SweepSpecError(
            "objective",
            "a sweep needs an objective: --objective METRIC[:max|min] (e.g. "
            "eval/reward/mean:max) or `objective:` in the space file",
        )
    return mapping


def cmd_sweep(args: argparse.Namespace) -> int:
    from jobs.sweeps.driver import start_sweep, trial_tags
    from jobs.sweeps.spec import parse_space

    if not args.space and not args.grid:
        print_error("give the search: --space SPACE.yaml and/or --grid OPTION=A,B,C")
        return 2
    base = load_config(args.config, args.set)
    spec = parse_space(space_mapping(args, base), base)
    with open_store() as store:
        sweep = start_sweep(store, base, spec, name=args.name, tags=args.tag)
    names = ", ".join(p.name for p in spec.parameters)
    objective = spec.objective
    print(
        f"sweep {sweep.id} '{sweep.name}' started: {spec.method} over {names}; "
        f"{spec.budget} run{'s' * (spec.budget != 1)}, {spec.parallel} at a time; objective "
        f"{objective.metric} "
        f"({objective.mode}, {objective.summary})"
    )
    if sweep.tags:
        print(f"its runs are tagged {', '.join(trial_tags(sweep.name, sweep.tags))}")
    print("the scheduler of `eslab serve` queues its runs")
    print(sweep_url(sweep.id))
    return 0


def cmd_sweeps(args: argparse.Namespace) -> int:
    from jobs.sweeps.driver import ranked, sweep_trials
    from jobs.sweeps.spec import SweepSpec

    with open_store() as store:
        sweeps = store.list_sweeps(limit=args.limit)
        rows = [("ID", "NAME", "STATUS", "METHOD", "RUNS", "LIVE", "BEST", "CREATED")]
        for sweep in sweeps:
            spec = SweepSpec.from_dict(sweep.spec)
            trials = sweep_trials(store, sweep.id)
            best = next(iter(ranked(trials, spec.objective.mode)), None)
            live = sum(1 for t in trials if not t.run.status.is_terminal())
            rows.append(
                (
                    str(sweep.id),
                    sweep.name,
                    sweep.status.value,
                    sweep.method,
                    f"{len(trials)}/{spec.budget}",
                    str(live),
                    "-" if best is None else f"{best.so_far:.4g} (run {best.run.id})",
                    sweep.created_at.astimezone().strftime("%Y-%m-%d %H:%M"),
                )
            )
    if not sweeps:
        print("no sweeps yet; `eslab sweep CONFIG --grid OPTION=A,B --objective METRIC` starts one")
        return 0
    print_table(rows)
    return 0
