"""`data.eval_sets`: several evaluation sets in one run, each reported on its own, as ES at
Scale evaluates its math task (VsonicV/es-at-scale, `train.py` builds `eval_dataloader_dict`,
one loader per split of its evaluation DatasetDict, and `trainer/es_trainer.py`'s `eval_step`
logs `eval/<split>/pass@1/mean` for each and `eval/avgpass@1/mean`, their plain mean).

The option is text, `name=file` pairs separated by commas (a file name cannot hold a comma
here), so that the CLI's `--set`, the form and YAML all take it as they take any option. A
name becomes part of a metric key, so it is letters, digits, `_`, `.` and `-`.

Light (no pyarrow): the configuration schema imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SEPARATOR = ","
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse_eval_sets(text: str | None) -> dict[str, str]:
    """`{name: file}` in the order given; ValueError saying what is wrong (its message
    completes "data.eval_sets ...")."""
    if text is None:
        return {}
    sets: dict[str, str] = {}
    for entry in text.split(SEPARATOR):
        name, equals, path = (part.strip() for part in entry.partition("="))
        if not equals or not name or not path:
            raise ValueError(
                f"entry {entry.strip()!r} is not name=file: write name=file pairs separated "
                f"by commas, e.g. math500=data/math/math500.parquet,aime24=data/math/aime24.parquet"
            )
        if NAME.fullmatch(name) is None:
            raise ValueError(
                f"set name {name!r} must start with a letter or digit and hold only letters, "
                "digits, _ . - (it becomes the metric key eval/<name>/pass@1/mean)"
            )
        if name in sets:
            raise ValueError(f"names the set {name!r} twice")
        sets[name] = path
    return sets


def format_eval_sets(sets: Mapping[str, str]) -> str | None:
    """The option's text for `{name: file}`; None for no sets."""
    return SEPARATOR.join(f"{name}={path}" for name, path in sets.items()) or None
