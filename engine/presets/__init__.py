"""Ready-made run configurations (YAML files beside this module): the references' settings,
adjusted where the small default model needs it (each file says why).

A preset's file opens with a comment that says what it is for and what it needs, in fields
the form and `eslab presets` show (the file stays a plain run configuration that
`eslab train FILE` reads):

    # For: what the run shows, on which model.
    # Needs: something to have or start first (a larger model, a service); repeatable.
    # Data: the `eslab data ...` command that writes its datasets.

A field goes on over the following lines that start with `#` and at least two spaces; any
other line ends it. The comment may go on with free text after a bare `#` line.

The sweeps that tune them live in `sweeps/` beside them (docs/sweeps.md, "Tuning the
presets"): `sweeps/PRESET.yaml` is the search that tuned PRESET (`eslab sweep PRESET --space
PRESET`), and the presets that have one are those meant to learn on the default model;
`sweeps/seeds.yaml` runs a preset with three seeds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.config import RunConfig
from engine.model_files import local_model
from engine.paths import resolve_path

PRESET_DIR = Path(__file__).parent
SWEEP_DIR = PRESET_DIR / "sweeps"
HEADER_FIELDS = ("For", "Needs", "Data")
_FIELD = re.compile(r"#\s?(?P<field>[A-Z][a-z]+):\s*(?P<text>.*)")
_MORE = re.compile(r"#\s{2,}(?P<text>\S.*)")


@dataclass(frozen=True)
class PresetInfo:
    """What a preset is for and what it needs, from its file's opening comment."""

    name: str
    purpose: str
    needs: tuple[str, ...] = ()
    data_command: str | None = None  # `eslab data ...`, which writes its train and eval files


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    return PRESET_DIR / f"{name}.yaml"


def sweep_space_names() -> list[str]:
    return sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))


def sweep_space_path(name: str) -> Path:
    return SWEEP_DIR / f"{name}.yaml"


def tuned_presets() -> list[str]:
    """The presets a sweep of sweeps/ tunes (one named after each): those meant to learn on
    the default model."""
    spaces = set(sweep_space_names())
    return [name for name in preset_names() if name in spaces]


def load_preset(name: str) -> RunConfig:
    return RunConfig.from_yaml(_existing(name))


def preset_info(name: str) -> PresetInfo:
    """The For/Needs/Data fields of a preset's opening comment; ValueError naming the file
    when a field is unknown, repeated (For, Data) or For is missing: a preset bug."""
    path = _existing(name)
    fields: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.strip() == "#":
            break
        if field := _FIELD.fullmatch(line):
            if field["field"] not in HEADER_FIELDS:
                raise ValueError(f"{path}: unknown field {field['field']!r} in the opening comment")
            fields.append((field["field"], field["text"]))
        elif (more := _MORE.fullmatch(line)) and fields:
            fields[-1] = (fields[-1][0], f"{fields[-1][1]} {more['text']}")
        else:
            fields.append(("", ""))  # ends the field before it
    found = {name: [text for f, text in fields if f == name] for name in HEADER_FIELDS}
    if len(found["For"]) != 1 or len(found["Data"]) > 1:
        raise ValueError(
            f"{path}: the opening comment needs one 'For:' line and at most one 'Data:'"
        )
    return PresetInfo(name, found["For"][0], tuple(found["Needs"]), next(iter(found["Data"]), None))


@dataclass(frozen=True)
class Missing:
    """A model folder or dataset a configuration names that is not there (yet)."""

    option: str  # model, train_file or eval_file
    named: str  # as the configuration names it
    where: Path  # where it was looked for (engine.paths.resolve_path)


def missing_files(config: RunConfig) -> list[Missing]:
    """The model folder (unless the model is a hub id) and the datasets a configuration names
    that are not where a run would look for them: for `data/...` the data folder that
    ESLAB_DATA_DIR names."""
    found: list[Missing] = []
    if (model := local_model(config.model.model)) is not None and not model.is_dir():
        found.append(Missing("model", config.model.model, model))
    for option in ("train_file", "eval_file"):
        named = getattr(config.data, option)
        if named is not None and not (where := resolve_path(named)).is_file():
            found.append(Missing(option, named, where))
    return found


def _existing(name: str) -> Path:
    path = preset_path(name)
    if not path.is_file():
        raise KeyError(f"no preset {name!r}; presets: {', '.join(preset_names())}")
    return path
