"""Run configurations as YAML: the one reader behind `eslab train FILE`, presets and the
form's import, and the writer behind `to_yaml` and the form's export.

Reading knows nothing of the schema: it turns text into the option mapping it holds, or into
a ConfigError naming the source (and the line of a syntax error); the schema converts and
checks the values. It is also the one gate for YAML from outside (a file, an upload), so it
refuses what costs more to read than a configuration ever needs: text over MAX_YAML_BYTES
(checked before parsing), anchors and aliases (a few lines of them expand into gigabytes:
"billion laughs"), nesting deeper than MAX_YAML_DEPTH (the parser recurses) and integers too
long for Python to read.
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


MAX_YAML_BYTES = 1 << 20
"""The largest run configuration read (1 MiB); real ones are a few kB."""
MAX_YAML_DEPTH = 8
"""Deepest nesting of mappings and lists read; a configuration nests two levels (group: option)."""


class _Refused(yaml.MarkedYAMLError):
    """YAML that is well formed but not read: an anchor, an alias, or nesting too deep."""


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false) that refuses anchors, aliases and
    deep nesting while composing, before anything is built.

    YAML 1.1 also reads yes/no/on/off as booleans, which would turn the natural
    `eval_strategy: no` into False.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                problem="anchors and aliases (&name, *name) are not allowed: write the values out",
                problem_mark=event.start_mark,
            )
        depth = getattr(self, "_depth", 0)
        if depth >= MAX_YAML_DEPTH:
            raise _Refused(
                problem=f"nesting deeper than {MAX_YAML_DEPTH} levels is not allowed",
                problem_mark=event.start_mark,
            )
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth


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
    if len(text.encode("utf-8") if isinstance(text, str) else text) > MAX_YAML_BYTES:
        raise _error(
            f"{source} is larger than {MAX_YAML_BYTES} bytes (1 MiB), the most a run "
            "configuration may have",
            source,
        )
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
        kind = "YAML refused" if isinstance(exc, _Refused) else "YAML syntax error"
        raise _error(f"{at}: {kind}: {exc.problem}", source) from None
    except ValueError as exc:  # an integer of more digits than Python reads, a 13th month
        reason = str(exc).split(";")[0]
        raise _error(f"{source}: YAML refused: a value cannot be read: {reason}", source) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _error(
            f"{source} must hold a mapping of option: value pairs, got a {type(data).__name__}",
            source,
        )
    return data


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """`read_yaml` of a file; its messages name the file. Reads at most one byte past the
    size limit, so a huge file (or /dev/zero) is refused without being read."""
    source = str(path)
    try:
        with Path(path).open("rb") as file:
            text = file.read(MAX_YAML_BYTES + 1)
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
