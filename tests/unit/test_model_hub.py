"""Model names: a folder here is used as it is; any other name comes from the Hugging Face hub.

This machine reaches no hub, so `huggingface_hub.snapshot_download` (the network call, and only
it) is replaced by a fake that lays out a folder or fails as the hub would.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from engine.model_files import HUB_FILES, ModelError, resolve_model


def make_model_folder(folder: Path) -> Path:
    """The smallest folder check_model_dir accepts (its files are not loaded)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_a_hub_model_id_is_downloaded_and_checked(monkeypatch, tmp_path):
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(make_model_folder(tmp_path / "cache" / "snapshot"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_model("some-org/tiny-model") == tmp_path / "cache" / "snapshot"
    assert calls == [("some-org/tiny-model", {"allow_patterns": HUB_FILES})]


def test_an_unreachable_hub_is_one_clear_error(monkeypatch):
    def snapshot_download(repo_id, **kwargs):
        raise OSError("We couldn't connect to the hub.\nCheck your internet connection.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(ModelError) as error:
        resolve_model("some-org/tiny-model")
    assert str(error.value) == (
        "model some-org/tiny-model is not a folder here and the Hugging Face hub could not be "
        "reached: OSError: We couldn't connect to the hub."
    )


def test_a_hub_download_that_is_no_model_folder_is_refused(monkeypatch, tmp_path):
    empty = tmp_path / "snapshot"
    empty.mkdir()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(empty))
    with pytest.raises(ModelError, match=r"has no config\.json"):
        resolve_model("some-org/not-a-model")


def hub_must_not_be_asked(repo_id, **kwargs):
    raise AssertionError(f"the hub was asked for {repo_id}")


def test_a_local_folder_never_asks_the_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub_must_not_be_asked)
    folder = make_model_folder(tmp_path / "org" / "model")
    assert resolve_model(folder) == folder
    assert resolve_model(str(folder)) == folder


def test_a_missing_path_is_a_missing_folder_not_a_hub_id(monkeypatch):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub_must_not_be_asked)
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("data/models/no-such-model")
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./no-such-model")


def test_offline_with_nothing_cached_is_the_same_clear_error(monkeypatch, tmp_path):
    # The real snapshot_download, told it is offline, with an empty cache: no network is tried.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError) as error:
        resolve_model("some-org/tiny-model")
    assert str(error.value).startswith(
        "model some-org/tiny-model is not a folder here and the Hugging Face hub could not be "
        "reached: "
    )


def test_a_run_on_a_hub_model_starts_from_the_downloaded_folder(monkeypatch, tmp_path):
    """The engines and the LoRA population get the folder, never the bare hub id."""
    from engine.config import RunConfig
    from engine.trainer.preflight import model_folder

    snapshot = make_model_folder(tmp_path / "snapshot")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(snapshot))
    required = {
        "method": "es",
        "train_file": "train.parquet",
        "output_dir": "data/runs/out",
        "reward_func_path": "engine.rewards.conciseness.compute_score",
    }
    config = RunConfig.from_flat({**required, "model": "some-org/tiny-model"})
    assert model_folder(config) == snapshot
    local = RunConfig.from_flat({**required, "model": str(tmp_path)})
    assert model_folder(local) == tmp_path  # a local folder never asks the hub
