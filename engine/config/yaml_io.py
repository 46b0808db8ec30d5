"""Run configurations as YAML: the one reader behind `eslab train FILE`, presets and the
form's import, and the writer behind `to_yaml` and the form's export.

Reading knows nothing of the schema: it turns text into the option mapping it holds, or into
a ConfigError naming the source (and the line of a syntax error); the schema converts and
checks the values.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from engine.config.errors import ConfigError, FieldError

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans: only true/false.

    YAML 1.1 also reads yes/no/on/off as booleans, which would turn the natural
    `eval_strategy: no` into False.
    """


_BOOL_TAG = "tag:yaml.org,2002:bool"
_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_yaml(text: str | bytes, source: str) -> dict[str, Any]:
    """The `option: value` mapping a YAML document holds (flat, nested or dotted keys, values
    as YAML types them); an empty document is an empty mapping. Bytes must be UTF-8."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _error(f"{source} is not UTF-8 text: {exc}", source) from None
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise _error(f"{at}: YAML syntax error: {exc.problem}", source) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _error(
            f"{source} must hold a mapping of option: value pairs, got a {type(data).__name__}",
            source,
        )
    return data


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """`read_yaml` of a file; its messages name the file."""
    source = str(path)
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise _error(f"cannot read {source}: {exc.strerror}", source) from None
    return read_yaml(text, source)


def write_yaml(config: RunConfig) -> str:
    """Flat `option: value` YAML, root options first, then one block per group headed by a
    comment: the group's name and its (one-line) docstring."""
    parts = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    root = {name: value for name, value in parts.items() if not dataclasses.is_dataclass(value)}
    blocks = [yaml.safe_dump(root, sort_keys=False)]
    for name, group in parts.items():
        if dataclasses.is_dataclass(group):
            title = (type(group).__doc__ or "").strip()
            blocks.append(
                f"# {name}: {title}\n" + yaml.safe_dump(dataclasses.asdict(group), sort_keys=False)
            )
    return "\n".join(blocks)


def _error(message: str, source: str) -> ConfigError:
    return ConfigError([FieldError("config", message)], source)
