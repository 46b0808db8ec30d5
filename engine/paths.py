"""Where ES Lab keeps its files.

The data folder defaults to `data/` in the repository (the project is installed editable, so
the package knows where that is) and can be moved with `ESLAB_DATA_DIR`, for example onto a
shared disk that Ray workers on other machines also see.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    return Path(os.environ.get("ESLAB_DATA_DIR", PROJECT_ROOT / "data"))


def default_model_dir() -> Path:
    return data_dir() / "models" / "smollm2-135m-instruct"


def resolve_path(path: str | Path) -> Path:
    """Relative paths in a run configuration are relative to the project root, so a run
    behaves the same whether it starts from a shell, a Ray job or the dashboard."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p
