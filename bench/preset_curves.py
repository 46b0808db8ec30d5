"""The presets meant to learn on the default model, each run with three seeds on this machine,
their eval curves judged by bench/curve_criteria.py (learned: at least 40% closer to the
task's optimum than before training; no collapse: the last eval within 15% of the best), and
docs/presets.md's tables and charts regenerated from them.

    .venv/bin/python bench/preset_curves.py [--presets NAME ...] [--seeds 1 2 3] [--steps N]
        [--set OPTION=VALUE ...] [--json FILE] [--write-docs]
    .venv/bin/python bench/preset_curves.py --from-json FILE --write-docs   # no runs

--presets defaults to the presets a sweep of engine/presets/sweeps tunes, and --seeds to the
seeds of engine/presets/sweeps/seeds.yaml: the runs `eslab sweep PRESET --space seeds` makes.
Here they run in this process on one engine (it starts once; each run begins from the input
weights, loaded back into it), so they take about the time of their steps. Each run writes
into a temporary folder in the data folder's runs/ (removed after it) and saves no
checkpoint; everything else is the preset's.

--steps N (max_steps) and --set OPTION=VALUE change every run: a quick check, or a candidate's
values tried before they go into the preset. The results and the page name such changes.
--json FILE writes the results; --write-docs writes them to bench/results/preset-curves.json
(unless --json names a file), the section between docs/presets.md's `preset-curves` markers
and one chart a preset, docs/images/preset-curves-PRESET.svg. Exits 1 when a run fails a
criterion, 2 on bad input (named before any engine starts).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from curve_criteria import CLOSER_BY, MAX_DROP, Verdict, judge  # noqa: E402
from doc_section import write_section  # noqa: E402

from engine import metrics as mk  # noqa: E402
from engine.config import ConfigError, RunConfig  # noqa: E402
from engine.config.yaml_io import read_yaml_file  # noqa: E402
from engine.paths import data_dir  # noqa: E402
from engine.presets import (  # noqa: E402
    load_preset,
    sweep_space_names,
    sweep_space_path,
    tuned_presets,
)
from engine.rewards import RewardError, load_reward_function  # noqa: E402

if TYPE_CHECKING:
    from engine.backends.pool import EnginePool
    from engine.sink import Sink

RESULTS = BENCH / "results" / "preset-curves.json"
PAGE = ROOT / "docs" / "presets.md"
IMAGES = ROOT / "docs" / "images"
SECTION = "preset-curves"
EVAL = mk.reward_key(mk.EVAL)
TRAIN = mk.reward_key(mk.TRAIN)
NO_FILES = ["save_strategy=no", "save_best_model=false"]


class BadInput(Exception):
    """A preset or option that cannot give a judged curve; the message names it."""


# -- what runs


def default_seeds() -> list[int]:
    """The seeds of the seeds sweep (engine/presets/sweeps/seeds.yaml)."""
    return list(read_yaml_file(sweep_space_path("seeds"))["parameters"]["seed"]["values"])


def tuned_options(preset: str) -> list[str]:
    """The options its tuning sweep searches (shown beside its curves), then max_steps."""
    names = []
    if preset in sweep_space_names():
        names = list(read_yaml_file(sweep_space_path(preset))["parameters"])
    return [*names, "max_steps"]


def optimum(config: RunConfig, preset: str) -> float:
    """The task's best reward, which its reward function's module states as OPTIMUM."""
    path = config.reward.reward_func_path
    if config.alignment.reward_source != "function" or not path:
        raise BadInput(
            f"preset {preset}: its reward comes from reward_source "
            f"{config.alignment.reward_source}, not from a reward function that states an optimum"
        )
    try:
        function = load_reward_function(path)
    except RewardError as exc:
        raise BadInput(f"preset {preset}: {exc}") from None
    value = getattr(sys.modules[function.__module__], "OPTIMUM", None)
    if not isinstance(value, int | float):
        raise BadInput(
            f"preset {preset}: reward module {function.__module__} states no OPTIMUM (the best "
            "reward there is), so how much closer a run got to it cannot be measured"
        )
    return float(value)


def changes(args: argparse.Namespace) -> list[str]:
    """What --set and --steps change in every run, as `option=value`."""
    return [*args.set, *([f"max_steps={args.steps}"] if args.steps else [])]


def preset_config(preset: str, args: argparse.Namespace) -> RunConfig:
    """The preset with the command line's changes, checked for what a run and the criteria
    need (its model folder, datasets and reward function as a run checks them)."""
    from engine.data.datasets import DatasetError
    from engine.model_files import ModelError
    from engine.trainer import plan_total_steps

    try:
        config = load_preset(preset).with_overrides(changes(args))
        plan_total_steps(config)
    except KeyError as exc:
        raise BadInput(exc.args[0]) from None
    except (ConfigError, DatasetError, ModelError, RewardError) as exc:
        raise BadInput(f"preset {preset}: {exc}") from None
    if config.eval.eval_strategy == "no" or not config.eval.eval_before_train:
        raise BadInput(
            f"preset {preset}: its curve needs eval_strategy steps or epoch and "
            "eval_before_train true (the eval before training is where it starts)"
        )
    return config


def seeded(config: RunConfig, seed: int, output_dir: Path) -> RunConfig:
    return config.with_overrides([f"seed={seed}", f"output_dir={output_dir}", *NO_FILES])


class SharedEngine:
    """One engine pool for runs whose model and perturbation options agree; each run gets it
    with the input weights loaded back (as the integration tests share their engine). The
    engine's own start seed does not matter: every request carries its run's seeds."""

    def __init__(self, master: Path) -> None:
        self.master = master
        self.pool: EnginePool | None = None
        self.key: tuple[object, object] | None = None

    def pool_for(self, config: RunConfig, sink: Sink) -> EnginePool:
        from engine.trainer import start_pool

        key = (config.model, config.lora)
        if self.pool is not None and key == self.key:
            self.pool.load_master(str(self.master))
            return self.pool
        self.close()
        started = time.perf_counter()
        self.pool = start_pool(config, sink)
        self.key = key
        self.pool.save_master(str(self.master))
        print(f"engine up in {time.perf_counter() - started:.0f} s", flush=True)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def run_one(engine: SharedEngine, config: RunConfig, title: str) -> dict[str, Any]:
    """One run's eval and train curves ([step, value] pairs) and its seconds."""
    from engine.progress import ProgressSink
    from engine.sink import MemorySink
    from engine.trainer import plan_total_steps, train

    memory = MemorySink()
    progress = ProgressSink(memory, plan_total_steps(config), title)
    started = time.perf_counter()
    try:
        train(config, progress, pool=engine.pool_for(config, progress))
    finally:
        progress.close()
    return {
        "eval": [list(point) for point in memory.series(EVAL)],
        "train": [list(point) for point in memory.series(TRAIN)],
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_all(args: argparse.Namespace, out: Path | None) -> dict[str, Any]:
    """Every preset's runs, every input checked before the engine starts; the results are
    written to `out` after each run, so a long job that stops keeps the runs it finished."""
    from engine.backends.vllm.cpu.resources import cpu_model

    configs = {name: preset_config(name, args) for name in args.presets}
    results: dict[str, Any] = {
        "command": "bench/preset_curves.py " + shlex.join(sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores",
        "changes": changes(args),
        "criteria": {"closer_by": CLOSER_BY, "max_drop": MAX_DROP},
        "presets": {
            name: {
                "optimum": optimum(config, name),
                "options": {k: config.to_flat()[k] for k in tuned_options(name)},
                "runs": [],
            }
            for name, config in configs.items()
        },
    }
    runs_dir = data_dir() / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="preset-curves-master-", dir=runs_dir) as master:
        engine = SharedEngine(Path(master))
        try:
            for name, config in configs.items():
                for seed in args.seeds:
                    output = Path(tempfile.mkdtemp(prefix=f"preset-curves-{name}-", dir=runs_dir))
                    try:
                        run = run_one(engine, seeded(config, seed, output), f"{name} seed {seed}")
                    finally:
                        shutil.rmtree(output, ignore_errors=True)
                    preset = results["presets"][name]
                    preset["runs"].append({"seed": seed, **run})
                    save(results, out)
                    print(verdict_line(name, seed, verdict(preset, run)), flush=True)
        finally:
            engine.close()
    return results


# -- what they show


def verdict(preset: dict[str, Any], run: dict[str, Any]) -> Verdict:
    return judge({int(step): value for step, value in run["eval"]}, preset["optimum"])


def verdict_line(name: str, seed: int, v: Verdict) -> str:
    closer = "-" if v.closer_by is None else f"{v.closer_by:.1%}"
    return (
        f"{name} seed {seed}: eval {v.before:.1f} -> best {v.best:.1f} (step {v.best_step}) -> "
        f"{v.after:.1f}; closer by {closer} ({'pass' if v.learned else 'fail'}), "
        f"no collapse {'pass' if v.kept else 'fail'}"
    )


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def preset_table(preset: dict[str, Any]) -> str:
    rows = [
        f"| seed | before | best (step) | after | closer by | learned (>= {CLOSER_BY:.0%}) "
        f"| drop from best | no collapse (<= {MAX_DROP:.0%}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in preset["runs"]:
        v = verdict(preset, run)
        rows.append(
            f"| {run['seed']} | {v.before:.1f} | {v.best:.1f} ({v.best_step}) | {v.after:.1f} "
            f"| {share(v.closer_by)} | {'pass' if v.learned else 'fail'} | {share(v.drop)} "
            f"| {'pass' if v.kept else 'fail'} |"
        )
    return "\n".join(rows)


def options_line(preset: dict[str, Any]) -> str:
    options = ", ".join(f"{k} {v}" for k, v in preset["options"].items())
    return f"{options}; optimum {preset['optimum']:g}"


def chart_svg(name: str, preset: dict[str, Any]) -> str:
    """The seeds' eval curves in the dashboard's chart style, rendered offline."""
    import pandas as pd

    from app.charts import metric_chart
    from app.report import chart_svg as render

    frame = pd.DataFrame(
        [
            {"step": step, "value": value, "seed": f"seed {run['seed']}"}
            for run in preset["runs"]
            for step, value in run["eval"]
        ]
    )
    chart = metric_chart(
        frame, "step", f"{name}: eval reward", color="seed", band=False, key=EVAL
    ).properties(width=520)
    return render(chart)


def page_section(results: dict[str, Any], image_dir: str) -> str:
    changes = results["changes"]
    lines = [
        f"Generated by `.venv/bin/python {results['command']}` on {results['date']} "
        f"({results['machine']}).",
    ]
    if changes:
        lines.append(f"\n**Not the presets as shipped**: every run changed {', '.join(changes)}.")
    for name, preset in results["presets"].items():
        seeds = len(preset["runs"])
        passed = all(verdict(preset, run).passed for run in preset["runs"])
        lines += [
            f"\n### {name}\n",
            f"{options_line(preset)}. {seeds} seed{'s' * (seeds != 1)}: "
            f"{'every one passes' if passed else 'not every one passes'}.\n",
            preset_table(preset),
            f"\n![{name}: eval reward of each seed]({image_dir}/preset-curves-{name}.svg)",
        ]
    return "\n".join(lines)


def write_docs(results: dict[str, Any]) -> None:
    for name, preset in results["presets"].items():
        (IMAGES / f"preset-curves-{name}.svg").write_text(chart_svg(name, preset))
    write_section(PAGE, SECTION, page_section(results, IMAGES.name))
    print(f"wrote {PAGE.relative_to(ROOT)} and its charts in {IMAGES.relative_to(ROOT)}")


def save(results: dict[str, Any], out: Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")


def read_results(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read results from {path}: {exc}") from None


def all_passed(results: dict[str, Any]) -> bool:
    return all(
        verdict(preset, run).passed
        for preset in results["presets"].values()
        for run in preset["runs"]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=tuned_presets(), metavar="NAME")
    parser.add_argument("--seeds", nargs="+", type=int, default=default_seeds(), metavar="SEED")
    parser.add_argument("--steps", type=int, help="max_steps of every run (a quick check)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="OPTION=VALUE", help="change every run"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results here")
    parser.add_argument("--write-docs", action="store_true", help="regenerate docs/presets.md")
    parser.add_argument("--from-json", type=Path, metavar="FILE", help="read results, run none")
    args = parser.parse_args()
    out = args.json or (RESULTS if args.write_docs and not args.from_json else None)
    try:
        if args.from_json:
            results = read_results(args.from_json)
            save(results, args.json)
        else:
            print(f"presets {' '.join(args.presets)}; seeds {' '.join(map(str, args.seeds))}")
            results = run_all(args, out)
    except BadInput as exc:
        print(f"preset_curves: {exc}", file=sys.stderr)
        return 2
    if out is not None:
        print(f"results in {out}")
    for name, preset in results["presets"].items():
        print(f"\n{name}: {options_line(preset)}\n{preset_table(preset)}")
    if args.write_docs:
        write_docs(results)
    return 0 if all_passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
