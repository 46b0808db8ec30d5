"""Ready-made run configurations (YAML files beside this module): the references' settings,
adjusted where the small default model needs it (each file says why)."""

from __future__ import annotations

from pathlib import Path

from engine.config import RunConfig

PRESET_DIR = Path(__file__).parent


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    return PRESET_DIR / f"{name}.yaml"


def load_preset(name: str) -> RunConfig:
    path = preset_path(name)
    if not path.is_file():
        raise KeyError(f"no preset {name!r}; presets: {', '.join(preset_names())}")
    return RunConfig.from_yaml(path)
