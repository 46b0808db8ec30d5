"""Where ES Lab keeps its files.

The data folder defaults to `data/` in the repository (the project is installed editable, so
the package knows where that is) and can be moved with `ESLAB_DATA_DIR`, for example onto a
shared disk that Ray workers on other machines also see.

A run writes its checkpoints and final model into its `output_dir`, and whoever may launch a
run chooses that folder, so it is confined (`output_dir_problem`): inside the data folder or
a folder listed in `ESLAB_OUTPUT_ROOTS`, never the project's own files nor a model folder.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    return Path(os.environ.get("ESLAB_DATA_DIR", PROJECT_ROOT / "data"))


def output_roots() -> list[Path]:
    """The folders run outputs may go into, resolved: the data folder, the repository's
    `data/runs` (where the presets write, so they work when ESLAB_DATA_DIR moves the data
    folder), then those of ESLAB_OUTPUT_ROOTS (separated by os.pathsep, relative ones
    relative to the project)."""
    extra = os.environ.get("ESLAB_OUTPUT_ROOTS", "").split(os.pathsep)
    extra_roots = [resolve_path(p.strip()).resolve() for p in extra if p.strip()]
    return [data_dir().resolve(), (PROJECT_ROOT / "data" / "runs").resolve(), *extra_roots]


def output_dir_problem(output_dir: str, model_dirs: list[Path]) -> str | None:
    """What is wrong with `output_dir` as a run's output folder, None when nothing is.

    Paths are compared after resolving `..` and symbolic links. The folder must lie strictly
    inside an output root; inside the project it must lie inside a root within the project (a
    broad root such as the home folder must not open the code); and it must neither hold nor
    lie inside the project or one of `model_dirs` (a run would overwrite the weights it
    reads, or save a model over the code)."""
    try:
        path = resolve_path(output_dir).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
        return f"is not a usable path ({exc})"
    project = PROJECT_ROOT.resolve()
    roots = output_roots()
    if path.is_relative_to(project):
        roots = [root for root in roots if root.is_relative_to(project)]
    if not any(path.is_relative_to(root) and path != root for root in roots):
        return (
            f"resolves to {path}, which is not a folder inside the data folder "
            f"({data_dir().resolve()}) or inside a folder of ESLAB_OUTPUT_ROOTS: use a folder "
            "such as data/runs/NAME, or ask the operator to add its parent to ESLAB_OUTPUT_ROOTS"
        )
    if project.is_relative_to(path):
        return f"resolves to {path}, which is or holds the project folder: use a folder of its own"
    for model in (m.resolve() for m in model_dirs):
        if path.is_relative_to(model) or model.is_relative_to(path):
            return f"resolves to {path}, which is, holds or lies in the model folder {model}"
    return None


def default_model_dir() -> Path:
    return data_dir() / "models" / "smollm2-135m-instruct"


def resolve_path(path: str | Path) -> Path:
    """Relative paths in a run configuration are relative to the project root, so a run
    behaves the same whether it starts from a shell, a Ray job or the dashboard."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p
