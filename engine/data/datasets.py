"""Parquet datasets: one row per prompt, columns `prompt` and `reward_func_args`.

The format of nlp-waseda/lbes (its `src/data_preprocessing/` scripts write it):
`prompt` holds chat messages ({role, content}, roles system/user/assistant) and
`reward_func_args` the keyword arguments of the reward function for that prompt. A `prompt`
column of strings holds raw text instead, sent to the model without a chat template
(engine/prompts.py); a dataset is one kind or the other, and a run names the kind it expects
(`prompt_format`), so a file of the wrong kind is refused rather than silently rendered
another way.

Storage decision. `write_dataset` stores `prompt` as list<struct<role, content>> and
`reward_func_args` as a JSON object string: a parquet struct column takes the union of all
rows' keys and fills the gaps with nulls, so heterogeneous arguments would not round-trip,
while JSON keeps each row's keys and value types (int vs float, lists) exactly. The loader
accepts both JSON strings and structs (as the reference's Hugging Face `to_parquet` writes);
in a struct column a null field means "absent" and is dropped, since it is how the union
marks a key the row never had. An optional `metadata` column (same encodings) carries what
is not an argument, such as a countdown puzzle's solution; the reward function never sees it.

Every error names the file, and where it applies the row (0-based) and the column.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.prompts import CHAT, PROMPT_FORMATS, RAW, Messages, Prompt, prompt_format

PROMPT = "prompt"
REWARD_FUNC_ARGS = "reward_func_args"
METADATA = "metadata"
REQUIRED_COLUMNS = (PROMPT, REWARD_FUNC_ARGS)
ROLES = ("system", "user", "assistant")

_PROMPT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_EXCERPT_CHARS = 120


class DatasetError(Exception):
    """A dataset file is missing or malformed, or a generator was given bad input."""


@dataclass(frozen=True)
class Example:
    """One prompt (chat messages or raw text) and the arguments its reward function is
    called with."""

    prompt: Prompt
    reward_func_args: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


class WriteResult(NamedTuple):
    """What a generator wrote: the files, and one line for the user."""

    paths: list[Path]
    summary: str


def load_dataset(path: str | Path, *, expected_format: str | None = None) -> list[Example]:
    """Read and validate a parquet dataset; raises DatasetError naming file, row, column.

    With `expected_format` (`chat` or `raw`, a run's prompt_format) a dataset of the other
    kind is refused, naming the file and the option."""
    path = Path(path)
    table = _read_table(path)
    if table.num_rows == 0:
        raise DatasetError(f"{path}: the dataset is empty (0 rows)")
    rows = range(table.num_rows)
    raw = _is_text(table, PROMPT)
    if expected_format is not None:
        _check_format(path, RAW if raw else CHAT, expected_format)
    prompts = _column_values(table, PROMPT)
    parse = parse_raw_prompt if raw else parse_prompt
    args = _column_values(table, REWARD_FUNC_ARGS)
    metadata = (
        _column_values(table, METADATA) if METADATA in table.column_names else [None] * len(rows)
    )
    return [
        Example(
            prompt=parse(prompts[row], _where(path, row, PROMPT)),
            reward_func_args=parse_mapping(
                args[row],
                _where(path, row, REWARD_FUNC_ARGS),
                drop_nulls=_is_struct(table, REWARD_FUNC_ARGS),
            ),
            # Metadata is optional, so a null cell is an empty dict.
            metadata=parse_mapping(
                metadata[row] or {},
                _where(path, row, METADATA),
                drop_nulls=_is_struct(table, METADATA),
            ),
        )
        for row in rows
    ]


def json_lines(path: str | Path, needs: Sequence[str], what: str) -> list[tuple[str, dict]]:
    """The JSON object of every non-blank line of a JSON-lines file, with where it is
    ("FILE: line N", for messages), each holding non-empty texts under the keys `needs`;
    DatasetError naming the file (and line) of anything else. `what` names the rows in the
    message of an empty file."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise DatasetError(f"{where}: expected a JSON object with {_quoted(needs)}")
        for key in needs:
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise DatasetError(f"{where}: '{key}' must be a non-empty string")
        rows.append((where, record))
    if not rows:
        raise DatasetError(f"{path}: no {what} (the file is empty)")
    return rows


def _quoted(keys: Sequence[str]) -> str:
    return " and ".join(f"'{k}'" for k in keys)


def write_dataset(examples: Iterable[Example | Mapping[str, Any]], path: str | Path) -> Path:
    """Validate `examples` (Example objects or mappings with the same keys) and write them
    to `path` as parquet, atomically, creating parent folders. Returns the path."""
    path = Path(path)
    rows = [_validated(example, path, row) for row, example in enumerate(examples)]
    if not rows:
        raise DatasetError(f"{path}: no examples to write; a dataset needs at least one row")
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; give the path of the .parquet file to write")
    kind = prompt_format(rows[0].prompt)
    for row, example in enumerate(rows):
        if prompt_format(example.prompt) != kind:
            raise DatasetError(
                f"{_where(path, row, PROMPT)}: is {prompt_format(example.prompt)} while row 0 "
                f"is {kind}; a dataset holds either chat messages or raw text prompts"
            )
    table = pa.table(
        {
            PROMPT: pa.array(
                [e.prompt for e in rows], type=pa.string() if kind == RAW else _PROMPT_TYPE
            ),
            REWARD_FUNC_ARGS: pa.array(
                [
                    _to_json(e.reward_func_args, path, i, REWARD_FUNC_ARGS)
                    for i, e in enumerate(rows)
                ],
                type=pa.string(),
            ),
            METADATA: pa.array(
                [_to_json(e.metadata, path, i, METADATA) for i, e in enumerate(rows)],
                type=pa.string(),
            ),
        }
    )
    write_atomically(path, lambda partial: pq.write_table(table, partial))
    return path


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(partial)` writes the file beside `path`, which is then renamed to `path` (parent
    folders created), so a reader never sees half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetError(f"{path.parent}: cannot create the folder ({exc})") from exc
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def parse_prompt(value: Any, where: str) -> Messages:
    """Validate one `prompt` cell of a chat dataset: a non-empty list of {role, content}
    chat messages."""
    value = _to_plain(value)
    if not isinstance(value, list) or not value:
        raise DatasetError(
            f"{where}: must be a non-empty list of chat messages {{role, content}} (or, in a "
            f"dataset of raw text prompts, a string), got {_excerpt(value)}"
        )
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise DatasetError(
                f"{where}: message {index} must be a dict with 'role' and 'content', "
                f"got {_excerpt(message)}"
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise DatasetError(
                f"{where}: message {index} has role {role!r}; it must be one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise DatasetError(
                f"{where}: message {index} content must be a string, got {_excerpt(content)}"
            )
        # Null extra fields come from struct unions in other tools' files; anything else
        # would be dropped without notice, so it is refused.
        extra = sorted(
            str(k) for k, v in message.items() if k not in ("role", "content") and v is not None
        )
        if extra:
            raise DatasetError(
                f"{where}: message {index} has keys {extra}; only 'role' and 'content' are used"
            )
        messages.append({"role": role, "content": content})
    return messages


def parse_raw_prompt(value: Any, where: str) -> str:
    """Validate one `prompt` cell of a raw text dataset: a string with something in it (a
    model cannot continue from nothing)."""
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: must be a non-empty raw text prompt, got {_excerpt(value)}")
    return value


def parse_mapping(value: Any, where: str, *, drop_nulls: bool = False) -> dict[str, Any]:
    """Validate one `reward_func_args` or `metadata` cell: a dict with string keys, or a
    JSON object string. `drop_nulls` removes null values (for struct columns)."""
    value = _to_plain(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: a string that is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise DatasetError(
            f"{where}: must be a dict (a parquet struct or a JSON object string), "
            f"got {_excerpt(value)}"
        )
    bad_keys = [k for k in value if not isinstance(k, str)]
    if bad_keys:
        raise DatasetError(f"{where}: keys must be strings, got {bad_keys!r}")
    if drop_nulls:
        return {k: v for k, v in value.items() if v is not None}
    return value


def _read_table(path: Path) -> pa.Table:
    if not path.exists():
        raise DatasetError(f"{path}: file not found")
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; give the path of a .parquet file")
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc
    columns = parquet.schema_arrow.names
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DatasetError(
            f"{path}: missing column {', '.join(map(repr, missing))}; a dataset needs the "
            f"columns {', '.join(REQUIRED_COLUMNS)} (found: {', '.join(columns) or 'none'})"
        )
    wanted = [c for c in (*REQUIRED_COLUMNS, METADATA) if c in columns]
    try:
        return parquet.read(columns=wanted)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: reading the parquet file failed ({exc})") from exc


def _column_values(table: pa.Table, name: str) -> list[Any]:
    column = table.column(name)
    values = column.to_pylist()
    # A map column reads back as lists of (key, value) pairs.
    if pa.types.is_map(column.type):
        return [None if v is None else dict(v) for v in values]
    return values


def _is_text(table: pa.Table, name: str) -> bool:
    column_type = table.schema.field(name).type
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type)


def _check_format(path: Path, found: str, expected: str) -> None:
    if expected not in PROMPT_FORMATS:
        raise ValueError(f"prompt format {expected!r} is not one of {PROMPT_FORMATS}")
    if found == expected:
        return
    holds = {CHAT: "chat messages", RAW: "raw text (a column of strings)"}
    raise DatasetError(
        f"{path}: the prompts are {holds[found]}, but the run's prompt_format is {expected!r}: "
        f"set prompt_format: {found}, or use a dataset whose prompts are {holds[expected]}"
    )


def _is_struct(table: pa.Table, name: str) -> bool:
    return name in table.column_names and pa.types.is_struct(table.schema.field(name).type)


def _validated(example: Example | Mapping[str, Any], path: Path, row: int) -> Example:
    if isinstance(example, Example):
        prompt, args, metadata = example.prompt, example.reward_func_args, example.metadata
    elif isinstance(example, Mapping):
        missing = [c for c in REQUIRED_COLUMNS if c not in example]
        if missing:
            raise DatasetError(f"{path}: row {row} has no {', '.join(map(repr, missing))}")
        prompt, args = example[PROMPT], example[REWARD_FUNC_ARGS]
        metadata = example.get(METADATA) or {}
    else:
        raise DatasetError(
            f"{path}: row {row} must be an Example or a mapping, got {type(example).__name__}"
        )
    parse = parse_raw_prompt if isinstance(prompt, str) else parse_prompt
    return Example(
        prompt=parse(prompt, _where(path, row, PROMPT)),
        reward_func_args=parse_mapping(args, _where(path, row, REWARD_FUNC_ARGS)),
        metadata=parse_mapping(metadata, _where(path, row, METADATA)),
    )


def _to_json(value: dict[str, Any], path: Path, row: int, column: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DatasetError(
            f"{_where(path, row, column)}: cannot be stored as JSON ({exc})"
        ) from exc


def _to_plain(value: Any) -> Any:
    """Turn NumPy arrays and scalars (as pandas hands them out) and tuples into Python
    lists and scalars, recursively."""
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_to_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _where(path: Path, row: int, column: str) -> str:
    return f"{path}: row {row}, column {column!r}"


def _excerpt(value: Any) -> str:
    text = f"{type(value).__name__} {value!r}"
    return text if len(text) <= _EXCERPT_CHARS else f"{text[:_EXCERPT_CHARS]}..."
