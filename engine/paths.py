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
a folder listed in `ESLAB_OUTPUT_ROOTS`, never the project's own files, a model folder, nor
the data folder's models, private or uploads folders. What a run reads (its datasets and a
model folder) is confined too (`input_problem`): the run's process can read every file this
user can, and a dataset's or model's errors are shown to whoever launched it.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_PREFIX = "data"
"""The first part of a configuration's relative path that names the data folder."""
MODELS_FOLDER = "models"
PRIVATE_FOLDER = "private"  # files only this user may read (jobs.private_files)
UPLOADS_FOLDER = "uploads"
NOT_OUTPUTS = {
    MODELS_FOLDER: "model weights",
    PRIVATE_FOLDER: "files only this user may read",
    UPLOADS_FOLDER: "uploaded datasets",
}
"""The data folder's folders a run never writes into, and what they hold."""
OUTPUT_ROOTS_SETTING = "ESLAB_OUTPUT_ROOTS"
INPUT_ROOTS_SETTING = "ESLAB_INPUT_ROOTS"


def data_dir() -> Path:
    return Path(os.environ.get("ESLAB_DATA_DIR", PROJECT_ROOT / "data"))


def extra_roots(setting: str) -> list[Path]:
    """The folders the setting (ESLAB_OUTPUT_ROOTS, ESLAB_INPUT_ROOTS) lists, separated by
    os.pathsep, resolved (relative ones as a configuration's paths are): what the scheduler
    hands its Ray jobs, so that a worker checks a run against the folders its service did."""
    listed = os.environ.get(setting, "").split(os.pathsep)
    return [resolve_path(p.strip()).resolve() for p in listed if p.strip()]


def output_roots() -> list[Path]:
    """The folders run outputs may go into, resolved: the data folder (where the presets'
    `data/runs/...` lies), then those of ESLAB_OUTPUT_ROOTS."""
    return [data_dir().resolve(), *extra_roots(OUTPUT_ROOTS_SETTING)]


def input_roots() -> list[Path]:
    """The folders a run may read datasets and model folders from, resolved: the output roots
    (a run may start from another's checkpoint), the project's own data/ (the shipped
    datasets, read even where ESLAB_DATA_DIR moved the data folder: `resolve_path`), then
    those of ESLAB_INPUT_ROOTS."""
    shipped = (PROJECT_ROOT / DATA_PREFIX).resolve()
    return [*output_roots(), shipped, *extra_roots(INPUT_ROOTS_SETTING)]


def input_problem(path: str) -> str | None:
    """What is wrong with `path` as a file or folder a run reads, None when nothing is.

    Compared after resolving `..` and symbolic links, it must be or lie inside an input root
    and outside every private folder (that of the data folder and of the project's data/,
    which a broad root would otherwise open)."""
    try:
        resolved = resolve_path(path).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
        return f"is not a usable path ({exc})"
    if not any(resolved.is_relative_to(root) for root in input_roots()):
        return (
            f"resolves to {resolved}, which is not inside the data folder "
            f"({data_dir().resolve()}) nor a folder of {INPUT_ROOTS_SETTING} or "
            f"{OUTPUT_ROOTS_SETTING}: copy it into the data folder, or ask the operator to add "
            f"its folder to {INPUT_ROOTS_SETTING}"
        )
    for data in {data_dir().resolve(), (PROJECT_ROOT / DATA_PREFIX).resolve()}:
        if resolved.is_relative_to(data / PRIVATE_FOLDER):
            return (
                f"resolves to {resolved}, which lies in the private folder {data / PRIVATE_FOLDER}"
            )
    return None


def output_dir_problem(output_dir: str, model_dirs: list[Path]) -> str | None:
    """What is wrong with `output_dir` as a run's output folder, None when nothing is.

    Paths are compared after resolving `..` and symbolic links. The folder must lie strictly
    inside an output root; inside the project it must lie inside a root within the project (a
    broad root such as the home folder must not open the code); it must neither hold nor
    lie inside the project or one of `model_dirs` (a run would overwrite the weights it
    reads, or save a model over the code), nor hold the data folder; and it must not lie in
    one of the data folder's NOT_OUTPUTS folders (another model, the private files, the uploads).
    Which folders other runs own is the database's to say: jobs.launch."""
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
    if (data := data_dir().resolve()).is_relative_to(path):
        return (
            f"resolves to {path}, which is or holds the data folder {data}: use a folder of its own"
        )
    for model in (m.resolve() for m in model_dirs):
        if path.is_relative_to(model) or model.is_relative_to(path):
            return f"resolves to {path}, which is, holds or lies in the model folder {model}"
    return _reserved_folder_problem(path)


def _reserved_folder_problem(path: Path) -> str | None:
    """Why the resolved output folder `path` would write into the data folder's own files."""
    data = data_dir().resolve()
    for name, holds in NOT_OUTPUTS.items():
        if path.is_relative_to(data / name):
            return (
                f"resolves to {path}, which lies in the data folder's {name} folder ({holds}): "
                "use a folder of its own such as data/runs/NAME"
            )
    return None


def default_model_dir() -> Path:
    return data_dir() / MODELS_FOLDER / "smollm2-135m-instruct"


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
