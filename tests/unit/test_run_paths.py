"""What a run may write and read: its output_dir never lies in the data folder's models,
private or uploads folders nor holds the data folder; its datasets and model folder lie in
the data folder, the project's shipped data, an output root or a folder of
ESLAB_INPUT_ROOTS, never in a private folder. Paths are compared after resolving `..` and
links, and every refusal names the option. (Other runs' folders: tests/jobs/test_output_dirs.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, RunConfig
from engine.paths import INPUT_ROOTS_SETTING, OUTPUT_ROOTS_SETTING, PROJECT_ROOT

HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHIPPED = PROJECT_ROOT / "data" / "conciseness" / "train.parquet"


@pytest.fixture
def data_folder(tmp_path, monkeypatch) -> Path:
    """A data folder of its own with a dataset and a model folder; no extra roots."""
    folder = tmp_path / "data"
    for sub in ("runs", "models/other", "private", "uploads", "task"):
        (folder / sub).mkdir(parents=True)
    (folder / "task" / "train.parquet").write_bytes(b"")
    monkeypatch.setenv("ESLAB_DATA_DIR", str(folder))
    monkeypatch.delenv(OUTPUT_ROOTS_SETTING, raising=False)
    monkeypatch.delenv(INPUT_ROOTS_SETTING, raising=False)
    return folder


def problems(data: Path, **options: str) -> dict[str, str]:
    values = {
        "model": HUB_MODEL,
        "train_file": str(data / "task" / "train.parquet"),
        "output_dir": str(data / "runs" / "mine"),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        **options,
    }
    try:
        RunConfig.from_flat(values)
    except ConfigError as exc:
        return {e.field: e.message for e in exc.errors}
    return {}


def test_a_run_in_its_own_folder_reading_the_data_folder_is_accepted(data_folder):
    assert problems(data_folder) == {}
    # a dataset the repository ships is found after ESLAB_DATA_DIR moved the data folder
    assert problems(data_folder, train_file="data/conciseness/train.parquet") == {}
    assert problems(data_folder, eval_file=str(SHIPPED)) == {}
    assert problems(data_folder, model=str(data_folder / "models" / "other")) == {}


@pytest.mark.parametrize(
    ("output_dir", "why"),
    [
        ("models/other", "lies in the data folder's models folder (model weights)"),
        ("models/other/run", "lies in the data folder's models folder"),
        ("models/new", "lies in the data folder's models folder"),
        ("private", "lies in the data folder's private folder"),
        ("private/x", "lies in the data folder's private folder"),
        ("uploads/x", "lies in the data folder's uploads folder (uploaded datasets)"),
        ("runs/../uploads/x", "lies in the data folder's uploads folder"),
        ("link/x", "lies in the data folder's models folder"),  # a link into models
    ],
)
def test_output_dir_in_the_data_folders_own_folders_is_refused(data_folder, output_dir, why):
    (data_folder / "link").symlink_to(data_folder / "models")
    message = problems(data_folder, output_dir=f"{data_folder}/{output_dir}")["output_dir"]
    assert message.startswith("data.output_dir ") and why in message


def test_an_output_root_around_the_data_folder_does_not_open_the_data_folder(
    data_folder, monkeypatch
):
    monkeypatch.setenv(OUTPUT_ROOTS_SETTING, str(data_folder.parent))
    assert problems(data_folder, output_dir=str(data_folder.parent / "elsewhere")) == {}
    message = problems(data_folder, output_dir=str(data_folder))["output_dir"]
    assert f"is or holds the data folder {data_folder}" in message


@pytest.mark.parametrize("option", ["train_file", "eval_file"])
@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "~/.ssh/id_rsa",
        "engine/paths.py",  # the project, outside its data/
        "{data}/../outside.parquet",
        "{data}/link/outside.parquet",  # a link out of the data folder
    ],
)
def test_a_dataset_outside_the_input_roots_is_refused(data_folder, option, path):
    (data_folder / "link").symlink_to(data_folder.parent)
    path = path.replace("{data}", str(data_folder))
    message = problems(data_folder, **{option: path})[option]
    assert message.startswith(f"data.{option} ") and "is not inside the data folder" in message
    assert INPUT_ROOTS_SETTING in message


def test_a_model_folder_outside_the_input_roots_is_refused(data_folder, tmp_path):
    model = tmp_path / "someone-elses-model"
    model.mkdir()
    message = problems(data_folder, model=str(model))["model"]
    assert message.startswith("model.model ") and "is not inside the data folder" in message
    assert problems(data_folder, model=HUB_MODEL) == {}  # a hub id is no path


def test_input_roots_widen_but_never_open_a_private_folder(data_folder, monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    (shared / "model").mkdir(parents=True)
    monkeypatch.setenv(INPUT_ROOTS_SETTING, f"{shared}:/")
    assert problems(data_folder, model=str(shared / "model")) == {}
    assert problems(data_folder, train_file="/etc/hosts") == {}  # "/" is listed
    for private in (data_folder / "private", PROJECT_ROOT / "data" / "private"):
        message = problems(data_folder, train_file=str(private / "database-url"))["train_file"]
        assert f"lies in the private folder {private}" in message


def test_a_run_may_read_what_runs_write_in_an_output_root(data_folder, monkeypatch, tmp_path):
    """A checkpoint of an earlier run, in a folder of ESLAB_OUTPUT_ROOTS, as the model."""
    checkpoint = tmp_path / "scratch" / "runs" / "a" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    assert "model" in problems(data_folder, model=str(checkpoint))
    monkeypatch.setenv(OUTPUT_ROOTS_SETTING, str(tmp_path / "scratch"))
    assert problems(data_folder, model=str(checkpoint)) == {}
