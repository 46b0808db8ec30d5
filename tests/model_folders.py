"""A model folder for tests that only check one: the files queueing checks (config.json with
a model_type, weights, a tokenizer) and no real weights, so nothing may load it."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
"""The default model's folder name in data/models, as the presets name it."""


def placeholder_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder
