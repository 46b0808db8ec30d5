"""Where ES Lab keeps its files.

The data folder defaults to `data/` in the repository (the project is installed editable, so
the package knows where that is) and can be moved with `ESLAB_DATA_DIR`, for example onto a
shared disk that Ray workers on other machines also see.

A run configuration names files and folders as `resolve_path` reads them: `data/X` is X in the
data folder, wherever ESLAB_DATA_DIR puts it (so a preset's `data/models/...` finds the models
kept there), any other relative path is relative to the project, and an absolute path is
itself. `config_path` is the inverse, the name the form and the data listings write. A run
stores its paths resolved (`RunConfig.with_resolved_paths`), so it reads the same files when it
is resumed or cloned under another ESLAB_DATA_DIR.

A run writes its checkpoints and final model into its `output_dir`, and whoever may launch a
run chooses that folder, so it is confined (`output_dir_problem`): inside the data folder or
a folder listed in `ESLAB_OUTPUT_ROOTS`, never the project's own files nor a model folder.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_PREFIX = "data"
"""The first part of a configuration's relative path that names the data folder."""


def data_dir() -> Path:
    return Path(os.environ.get("ESLAB_DATA_DIR", PROJECT_ROOT / "data"))


def output_roots() -> list[Path]:
    """The folders run outputs may go into, resolved: the data folder (where the presets'
    `data/runs/...` lies), then those of ESLAB_OUTPUT_ROOTS (separated by os.pathsep, relative
    ones resolved as a configuration's paths are)."""
    extra = os.environ.get("ESLAB_OUTPUT_ROOTS", "").split(os.pathsep)
    extra_roots = [resolve_path(p.strip()).resolve() for p in extra if p.strip()]
    return [data_dir().resolve(), *extra_roots]


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
    """The file or folder a run configuration's `path` names, the same whether the run starts
    from a shell, a Ray job or the dashboard: absolute as given; `data/X` in the data folder;
    any other relative path in the project.

    The repository ships datasets in its own data/ (data/conciseness, data/alignment): a
    `data/X` that the data folder lacks is the checkout's data/X when that is a file, so the
    presets' datasets are found after ESLAB_DATA_DIR moves the data folder (a copy in the
    data folder wins). Folders (models, outputs) never fall back: a run's output must not
    land in the checkout because an old folder of that name is there."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if p.parts[:1] != (DATA_PREFIX,):
        return PROJECT_ROOT / p
    inside = Path(*p.parts[1:])
    found = data_dir().absolute() / inside
    shipped = PROJECT_ROOT / DATA_PREFIX / inside
    return shipped if not found.exists() and shipped.is_file() else found


def config_path(path: Path) -> str:
    """How a run configuration names the absolute `path`, the inverse of `resolve_path`:
    `data/X` inside the data folder, relative inside the project (outside its data/, which
    `data/` would no longer name once ESLAB_DATA_DIR moves the data folder), else absolute."""
    data = data_dir().absolute()
    if path.is_relative_to(data):
        return str(DATA_PREFIX / path.relative_to(data))
    if path.is_relative_to(PROJECT_ROOT) and not path.is_relative_to(PROJECT_ROOT / DATA_PREFIX):
        return str(path.relative_to(PROJECT_ROOT))
    return str(path)
