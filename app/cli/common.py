"""What the `eslab` commands share: the errors that become one line instead of a traceback,
the run database, run configurations from a file or preset with `--set` changes, checks of
ports and service addresses given on the command line or in settings, and the address of a
run's or a sweep's dashboard page."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import ConfigError, RunConfig
from engine.config.urls import HTTP, url_problem
from engine.data.datasets import DatasetError
from engine.extras import MissingExtra
from engine.model_files import ModelError
from engine.rewards import RewardError
from engine.scoring.client import ScorerError
from jobs.store.errors import StoreError
from jobs.sweeps.spec import SweepSpecError
from scorer.models import ScoringModelError

if TYPE_CHECKING:
    from jobs.store.store import Store

DASHBOARD_PORT = 8501
RAY_SCHEMES = ("ray", "http", "https")


class SettingError(Exception):
    """An environment setting ES Lab cannot use; the message names it."""


USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    SettingError,
    DatasetError,
    MissingExtra,
    ModelError,
    RewardError,
    StoreError,
    SweepSpecError,
    ScorerError,
    ScoringModelError,
)


def print_error(message: str) -> None:
    print(f"eslab: error: {message}", file=sys.stderr)


def print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows of cells (the first the header) in aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def open_store() -> closing[Store]:
    """The run database (ESLAB_DATABASE_URL), closed when the `with` block ends. Imported
    here, not at the top, so that `eslab --help` does not load SQLAlchemy."""
    from jobs.store.store import Store

    return closing(Store())


def add_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--set OPTION=VALUE`, repeatable; RunConfig.with_overrides checks the pairs."""
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help=help)


def checkpoint_of(run_or_path: str) -> Path:
    """A checkpoint folder as given, or the latest checkpoint of a run (id or uuid prefix)."""
    if Path(run_or_path).is_dir():
        return Path(run_or_path)
    with open_store() as store:
        checkpoints = store.checkpoints(run_or_path)
    if not checkpoints:
        raise StoreError(
            f"run {run_or_path} has no checkpoint: set save_strategy, or pass a "
            "checkpoint-STEP folder"
        )
    return Path(checkpoints[-1].path)


def load_config(path: str, overrides: list[str]) -> RunConfig:
    """A YAML file, or the name of a preset (engine/presets) when no such file exists."""
    from engine.presets import preset_path

    if _names_a_preset(path):
        path = str(preset_path(path))
    config = RunConfig.from_yaml(path)
    return config.with_overrides(overrides) if overrides else config


def load_run_config(path: str, overrides: list[str]) -> RunConfig:
    """load_config for one run (`eslab submit`, `eslab train`). A preset's run gets a name
    and a folder of its own, data/runs/RUN_NAME, as the New run form gives it: the preset's
    output_dir is one folder for every run of it, which a second run may not share
    (jobs.launch). An output_dir given with --set, or by a file of one's own, is kept."""
    from engine.data.local import default_output_dir
    from jobs.planning import default_run_name

    config = load_config(path, overrides)
    if not _names_a_preset(path) or overridden(overrides, "output_dir"):
        return config
    name = config.logging.run_name or default_run_name(config)
    return config.with_overrides([f"run_name={name}", f"output_dir={default_output_dir(name)}"])


def _names_a_preset(path: str) -> bool:
    from engine.presets import preset_names

    return not Path(path).exists() and path in preset_names()


def overridden(pairs: list[str], option: str) -> bool:
    """Whether `--set` pairs (`option=...` or `group.option=...`) give `option`."""
    return any(p.partition("=")[0].strip().rpartition(".")[2] == option for p in pairs)


def port(text: str) -> int:
    """argparse type of `--port`: a number from 1 to 65535 (argparse names the option)."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is no port: give a number from 1 to 65535")
    return int(text)


def reward_spec(text: str) -> str:
    """argparse type of an option naming a reward (a dotted path, `scorer` or a scorer URL):
    a URL with a bad port or no host is refused before anything starts."""
    if text.startswith(tuple(f"{scheme}://" for scheme in HTTP)) and (problem := url_problem(text)):
        raise argparse.ArgumentTypeError(f"the scorer URL {problem}")
    return text


def check_ray_address() -> None:
    """RAY_ADDRESS, when set, must be `auto`, host:port, ray://host:port or http(s)://...;
    a bad port is one line here, not a timeout of Ray's client."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address in ("", "auto", "local"):
        return
    if problem := url_problem(address, RAY_SCHEMES, bare=True):
        raise SettingError(f"RAY_ADDRESS {problem}")


def dashboard_url(run_id: int) -> str:
    """The run's page on the dashboard."""
    return page_url(f"run?run={run_id}")


def sweep_url(sweep_id: int) -> str:
    """The sweep's page on the dashboard."""
    return page_url(f"sweep?sweep={sweep_id}")


def page_url(page: str) -> str:
    """`page` on the dashboard `eslab serve` runs on this data folder (on any port), else on
    the default port; ESLAB_DASHBOARD_URL names the server when it is not the local one. A
    bad setting is said in place of the link: what it links to exists already."""
    from jobs.service import serving_dashboard

    base = (
        os.environ.get("ESLAB_DASHBOARD_URL")
        or serving_dashboard()
        or f"http://127.0.0.1:{DASHBOARD_PORT}"
    )
    if problem := url_problem(base):
        return f"(no dashboard link: ESLAB_DASHBOARD_URL {problem})"
    return f"{base.rstrip('/')}/{page}"
