"""A configuration's `data/...` paths name the data folder that ESLAB_DATA_DIR names (the
checkout's data/ when it is unset): a preset finds the models kept there, the datasets the
checkout ships still resolve, and a planned run stores the paths resolved."""

from pathlib import Path

import pytest

from app.cli import main
from engine.paths import PROJECT_ROOT, config_path, resolve_path
from engine.presets import load_preset, missing_files
from jobs.planning import plan_run
from tests.model_folders import DEFAULT_MODEL as MODEL
from tests.model_folders import placeholder_model


@pytest.fixture
def data_folder(tmp_path, monkeypatch) -> Path:
    """ESLAB_DATA_DIR = a folder of the test's own holding the default model's folder."""
    folder = tmp_path / "shared-data"
    placeholder_model(folder / "models" / MODEL)
    monkeypatch.setenv("ESLAB_DATA_DIR", str(folder))
    return folder


def test_data_paths_follow_the_data_folder_and_other_paths_the_project(data_folder):
    assert resolve_path("data/models/x") == data_folder / "models" / "x"
    assert resolve_path("./data/runs/r") == data_folder / "runs" / "r"
    assert resolve_path("tests/fixtures/x.parquet") == PROJECT_ROOT / "tests/fixtures/x.parquet"
    assert resolve_path("database/x") == PROJECT_ROOT / "database" / "x"  # only data/ itself
    assert resolve_path("/abs/data/x") == Path("/abs/data/x")


def test_a_shipped_dataset_is_the_checkouts_until_the_data_folder_has_its_own(data_folder):
    shipped = PROJECT_ROOT / "data" / "conciseness" / "train.parquet"
    assert resolve_path("data/conciseness/train.parquet") == shipped
    own = data_folder / "conciseness" / "train.parquet"
    own.parent.mkdir()
    own.write_bytes(b"")
    assert resolve_path("data/conciseness/train.parquet") == own
    # a folder never falls back: an output lands in the data folder
    assert resolve_path("data/conciseness") == data_folder / "conciseness"
    assert resolve_path("data/alignment") == data_folder / "alignment"


def test_config_path_names_what_resolve_path_finds(data_folder):
    for path in (
        data_folder / "models" / MODEL,
        data_folder / "runs" / "r",
        PROJECT_ROOT / "tests" / "x.parquet",
        PROJECT_ROOT / "data" / "conciseness" / "test.parquet",  # the checkout's, not data/
        Path("/elsewhere/x.parquet"),
    ):
        assert resolve_path(config_path(path)) == path
    assert config_path(data_folder / "models" / MODEL) == f"data/models/{MODEL}"


def test_a_preset_resolves_into_the_data_folder_and_its_run_stores_that(data_folder):
    config = load_preset("es-conciseness")
    assert config.model.model == f"data/models/{MODEL}"  # as the preset names it
    assert resolve_path(config.model.model) == data_folder / "models" / MODEL
    assert missing_files(config) == []  # the model there, the shipped datasets found
    stored = plan_run(config).config  # validation and the model and dataset checks pass
    assert stored["model"] == str(data_folder / "models" / MODEL)
    assert stored["train_file"] == str(PROJECT_ROOT / "data/conciseness/train.parquet")
    assert stored["eval_file"] == str(PROJECT_ROOT / "data/conciseness/test.parquet")
    assert stored["output_dir"] == str(data_folder / "runs" / "es-conciseness")


def test_without_the_setting_a_preset_resolves_into_the_checkout(monkeypatch):
    monkeypatch.delenv("ESLAB_DATA_DIR", raising=False)
    config = load_preset("es-conciseness")
    assert resolve_path(config.model.model) == PROJECT_ROOT / "data" / "models" / MODEL
    assert resolve_path(config.data.output_dir) == PROJECT_ROOT / "data/runs/es-conciseness"


def test_a_hub_model_id_is_stored_as_it_is(data_folder):
    config = load_preset("es-conciseness").with_overrides(["model=Qwen/Qwen2.5-1.5B-Instruct"])
    assert config.with_resolved_paths().model.model == "Qwen/Qwen2.5-1.5B-Instruct"


def test_eslab_presets_checks_the_data_folder(data_folder, tmp_path, monkeypatch, capsys):
    assert main(["presets"]) == 0
    listing = capsys.readouterr().out.split("\n" + "es-countdown\n")[0]
    assert "Ready: its model and datasets are there" in listing.split("es-conciseness\n")[1]
    empty = tmp_path / "empty"
    monkeypatch.setenv("ESLAB_DATA_DIR", str(empty))
    assert main(["presets"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    where = empty / "models" / MODEL
    assert f"Missing model data/models/{MODEL} (looked for at {where})" in flat
    assert "Ready:" not in flat.split("es-conciseness ")[1].split(" es-countdown ")[0]


def test_eslab_data_out_writes_where_a_configuration_looks(data_folder, capsys):
    assert main(["data", "conciseness", "--out", "data/mine"]) == 0
    assert (data_folder / "mine" / "train.parquet").is_file()
