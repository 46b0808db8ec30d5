"""ES at Scale's own countdown file (VsonicV/es-at-scale, `archive/countdown/data/countdown.json`)
to ES Lab datasets, with the reference's exact splits: `eslab data countdown --format
es-at-scale --input FILE`.

The file is the user's copy, read at run time; nothing of it is in this repository. It is a
JSON list of 2200 puzzles {id, context, numbers, target, solution}. The reference trains on the
first 200 (`archive/es_fine-tuning_countdown.py` takes `dataset[:data_sample]`, run with
`--data_sample 200`) and evaluates on the last 2000 (`archive/eval_countdown.py`,
`--eval_offset -2000 --eval_samples 2000`), so `train.parquet` holds the first N_TRAIN
puzzles in the file's order and `test.parquet` the last N_TEST. A file of another length is
refused: with 2200 the two parts are the whole file and disjoint, and a truncated or other
file would silently give other splits (--n-train / --n-test state other sizes on purpose).

Each puzzle becomes a raw prompt (prompt_format: raw) with reward_func_args {numbers, target},
the arguments of engine.rewards.countdown_es_at_scale, and its id and solution as metadata
where the file has them. The prompt is the puzzle's own `context`, the reference's text, sent
as it is, as its scripts send it; a file without contexts gets ES Lab's prompt
(engine.data.countdown_es_at_scale.PROMPT), and one with some contexts missing is refused
rather than mixed. Every error names the file and, where it applies, the puzzle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.data.countdown_es_at_scale import DEFAULT_N_TEST, DEFAULT_N_TRAIN, context
from engine.data.datasets import DatasetError, Example, WriteResult, write_dataset
from engine.rewards import countdown_es_at_scale as grader

NEEDS = ("numbers", "target")
CONTEXT = "context"
KEPT = ("id", "solution")  # kept as metadata; the reward function never sees them


def convert_countdown_es_at_scale(
    input_json: str | Path,
    out_dir: str | Path,
    *,
    n_train: int = DEFAULT_N_TRAIN,
    n_test: int = DEFAULT_N_TEST,
) -> WriteResult:
    """Write `train.parquet` (the file's first `n_train` puzzles) and `test.parquet` (its last
    `n_test`) into `out_dir`; DatasetError naming the file for anything else."""
    for name, count in (("n_train", n_train), ("n_test", n_test)):
        if count < 1:
            raise DatasetError(f"{name} must be at least 1, got {count}")
    path = Path(input_json)
    puzzles = read_puzzles(path, n_train + n_test)
    own = _has_contexts(path, puzzles)
    examples = [to_example(path, index, puzzle) for index, puzzle in enumerate(puzzles)]
    out_dir = Path(out_dir)
    paths = [
        write_dataset(examples[:n_train], out_dir / "train.parquet"),
        write_dataset(examples[-n_test:], out_dir / "test.parquet"),
    ]
    prompts = "the file's own prompts" if own else f"ES Lab's prompt (the file has no {CONTEXT!r})"
    summary = (
        f"countdown from {path}: puzzles 0-{n_train - 1} train and {n_train}-"
        f"{len(puzzles) - 1} test ({n_train} and {n_test}) in {out_dir} (train.parquet, "
        f"test.parquet; prompt_format: raw; {prompts})"
    )
    return WriteResult(paths, summary)


def read_puzzles(path: Path, count: int) -> list[dict[str, Any]]:
    """The file's list of `count` JSON objects."""
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from exc
    try:
        puzzles = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(puzzles, list):
        raise DatasetError(
            f"{path}: expected a JSON list of puzzles (ES at Scale's countdown.json), got a "
            f"{type(puzzles).__name__}"
        )
    if len(puzzles) != count:
        raise DatasetError(
            f"{path}: {len(puzzles)} puzzles, expected {count}: ES at Scale's countdown.json "
            f"holds {DEFAULT_N_TRAIN + DEFAULT_N_TEST} (the first {DEFAULT_N_TRAIN} train, the "
            f"last {DEFAULT_N_TEST} test); --n-train and --n-test give other split sizes"
        )
    for index, puzzle in enumerate(puzzles):
        if not isinstance(puzzle, dict):
            raise DatasetError(
                f"{_where(path, index)}: expected a JSON object with "
                f"{', '.join(map(repr, NEEDS))}, got a {type(puzzle).__name__}"
            )
        missing = [key for key in NEEDS if key not in puzzle]
        if missing:
            raise DatasetError(f"{_where(path, index)}: no {' or '.join(map(repr, missing))}")
    return puzzles


def to_example(path: Path, index: int, puzzle: dict[str, Any]) -> Example:
    """One puzzle as an ES Lab example; DatasetError naming the puzzle and the key."""
    where = _where(path, index)
    numbers = puzzle["numbers"]
    try:
        if not isinstance(numbers, list) or not numbers:
            raise ValueError(f"numbers must be a non-empty list, got {numbers!r}")
        grader.as_numbers(numbers)
        grader.as_target(puzzle["target"])
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    prompt = puzzle.get(CONTEXT)
    if prompt is None:
        prompt = context(numbers, str(puzzle["target"]))
    elif not isinstance(prompt, str) or not prompt.strip():
        raise DatasetError(f"{where}: {CONTEXT!r} must be a non-empty string, got {prompt!r}")
    return Example(
        prompt=prompt,
        reward_func_args={"numbers": numbers, "target": puzzle["target"]},
        metadata={key: puzzle[key] for key in KEPT if key in puzzle},
    )


def _has_contexts(path: Path, puzzles: list[dict[str, Any]]) -> bool:
    """Whether the puzzles carry their own prompts: all of them, or none."""
    without = [index for index, puzzle in enumerate(puzzles) if CONTEXT not in puzzle]
    if without and len(without) < len(puzzles):
        raise DatasetError(
            f"{_where(path, without[0])}: no {CONTEXT!r} while other puzzles have one; the "
            "prompts would mix the file's text and ES Lab's"
        )
    return not without


def _where(path: Path, index: int) -> str:
    return f"{path}: puzzle {index}"
