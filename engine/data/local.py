"""What the data folder offers a run: its model folders, its parquet datasets (shipped,
generated and uploaded) and a run's default output folder, each named as a run
configuration names it (`data/...`, which resolves to the data folder wherever
ESLAB_DATA_DIR puts it: engine.paths.config_path). The New run form offers these; a run may
still name anything else."""

from __future__ import annotations

import os
from pathlib import Path

from engine.filenames import safe_file_name
from engine.paths import MODELS_FOLDER, PRIVATE_FOLDER, config_path, data_dir

RUNS_FOLDER = "runs"
# Folders of the data folder that hold no datasets: weights, checkpoints, caches, secrets.
NOT_DATASETS = frozenset({MODELS_FOLDER, RUNS_FOLDER, "cache", PRIVATE_FOLDER})
# Datasets are looked for at most two folders down (data/a/b/x.parquet); a deeper walk would
# only read folders people keep there for other reasons.
MAX_DATASET_DEPTH = 3


def _root() -> Path:
    return data_dir().absolute()


def model_folders() -> list[str]:
    """Every folder of data/models that holds a Hugging Face model (a config.json)."""
    folder = _root() / MODELS_FOLDER
    if not folder.is_dir():
        return []
    return sorted(
        config_path(entry)
        for entry in folder.iterdir()
        if not entry.name.startswith(".") and (entry / "config.json").is_file()
    )


def dataset_files() -> list[str]:
    """Every parquet file of the data folder outside NOT_DATASETS, uploads included (they
    are kept in data/uploads), hidden files and folders skipped (an upload being written is
    hidden)."""
    root = _root()
    found = []
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).relative_to(root).parts)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and depth + 1 < MAX_DATASET_DEPTH
            and not (depth == 0 and d in NOT_DATASETS)
        ]
        found += [
            config_path(Path(folder) / f)
            for f in files
            if f.endswith(".parquet") and not f.startswith(".")
        ]
    return sorted(found)


def default_output_dir(run_name: str) -> str:
    """A run's own folder under the data folder, data/runs/RUN_NAME (the run name in safe
    characters): inside the data folder, where output_dir may always lie."""
    return config_path(_root() / RUNS_FOLDER / safe_file_name(run_name, "", "run"))
