"""What the data folder offers a run (engine.data.local): model folders, parquet datasets
with uploads, and a run's default output folder, which the output_dir rules accept; each
named data/... wherever ESLAB_DATA_DIR puts the data folder, and resolving back there."""

from engine.config import RunConfig
from engine.data.local import dataset_files, default_output_dir, model_folders
from engine.paths import resolve_path


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_models_are_the_folders_of_data_models_with_a_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    assert model_folders() == []  # no models folder yet
    touch(tmp_path / "models" / "b" / "config.json")
    touch(tmp_path / "models" / "a" / "config.json")
    touch(tmp_path / "models" / "half-fetched" / "model.safetensors")
    touch(tmp_path / "models" / ".hidden" / "config.json")
    assert model_folders() == ["data/models/a", "data/models/b"]
    assert resolve_path("data/models/a") == tmp_path / "models" / "a"


def test_datasets_are_the_parquet_files_of_the_data_folder_uploads_included(tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    offered = [
        touch(tmp_path / "countdown3" / "train.parquet"),
        touch(tmp_path / "top.parquet"),
        touch(tmp_path / "uploads" / "1a2b-mine.parquet"),
        touch(tmp_path / "a" / "b" / "deep.parquet"),
    ]
    for skipped in (
        "uploads/.1a2b.partial.parquet",  # an upload being written
        ".cache/x.parquet",
        "models/m/x.parquet",
        "runs/r/x.parquet",
        "a/b/c/too-deep.parquet",
        "countdown3/train.json",
    ):
        touch(tmp_path / skipped)
    assert dataset_files() == sorted(f"data/{p.relative_to(tmp_path)}" for p in offered)
    assert [resolve_path(f) for f in dataset_files()] == sorted(offered)


def test_the_default_output_dir_is_the_runs_own_folder_and_passes_the_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    assert default_output_dir("lbes run/../x") == "data/runs/lbes-run-..-x"
    assert resolve_path(default_output_dir("x")) == tmp_path / "runs" / "x"
    monkeypatch.delenv("ESLAB_DATA_DIR")
    folder = default_output_dir("my run")
    assert folder == "data/runs/my-run"
    config = RunConfig.from_flat(
        {
            "train_file": "t.parquet",
            "reward_func_path": "engine.rewards.gsm8k.compute_score",
            "output_dir": folder,
        }
    )
    assert config.data.output_dir == folder
