"""What the `eslab` commands share: the errors that become one line instead of a traceback,
the run database, run configurations from a file or preset with `--set` changes, and the
address of a run's dashboard page."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import ConfigError, RunConfig
from engine.data.datasets import DatasetError
from engine.extras import MissingExtra
from engine.model_files import ModelError
from engine.rewards import RewardError
from engine.scoring.client import ScorerError
from jobs.store.errors import StoreError
from scorer.models import ScoringModelError

if TYPE_CHECKING:
    from jobs.store.store import Store

DASHBOARD_PORT = 8501
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    DatasetError,
    MissingExtra,
    ModelError,
    RewardError,
    StoreError,
    ScorerError,
    ScoringModelError,
)


def print_error(message: str) -> None:
    print(f"eslab: error: {message}", file=sys.stderr)


def open_store() -> closing[Store]:
    """The run database (ESLAB_DATABASE_URL), closed when the `with` block ends. Imported
    here, not at the top, so that `eslab --help` does not load SQLAlchemy."""
    from jobs.store.store import Store

    return closing(Store())


def add_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--set OPTION=VALUE`, repeatable; RunConfig.with_overrides checks the pairs."""
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE", help=help)


def load_config(path: str, overrides: list[str]) -> RunConfig:
    """A YAML file, or the name of a preset (engine/presets) when no such file exists."""
    from engine.presets import preset_names, preset_path

    if not Path(path).exists() and path in preset_names():
        path = str(preset_path(path))
    config = RunConfig.from_yaml(path)
    return config.with_overrides(overrides) if overrides else config


def dashboard_url(run_id: int) -> str:
    """The run's page; ESLAB_DASHBOARD_URL names the server when it is not the local one."""
    base = os.environ.get("ESLAB_DASHBOARD_URL", f"http://127.0.0.1:{DASHBOARD_PORT}")
    return f"{base.rstrip('/')}/run?run={run_id}"
