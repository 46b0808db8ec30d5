"""Pre-labelled generations for best-of-n without sampling: the user's copy of a file in the
layout of tlc4418/llm_optimization's best-of-n data (its `tlc4418/gold_labelled_gens`, and the
`proxy_labelled_sorted.json` files its pipeline writes), read at run time.

A row has `instruction` (text), `input` (text, may be empty or absent), `answers` (N texts) and
`gold_scores` (N numbers, the gold reward model's score of each answer); other columns are
ignored. The prompt a proxy reads is the instruction, then a newline and the input when there
is one, as the reference joins them for its reward models. The reference cuts every row to its
first `big_n` answers; `samples` does the same here, and without it every row must have the same
number of answers (the estimator's N).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.data.datasets import DatasetError

SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass(frozen=True)
class GoldGenerations:
    prompts: list[str]
    answers: list[list[str]]  # [prompts][N]
    gold: np.ndarray  # [prompts, N]


def read_gold_generations(path: str | Path, samples: int | None = None) -> GoldGenerations:
    """The rows of `path` (.parquet, .jsonl, or .json holding a list of rows), checked and cut
    to their first `samples` answers; DatasetError naming the file, row and field otherwise."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise DatasetError(f"{path}: no rows")
    if samples is not None and samples < 1:
        raise DatasetError(f"samples must be at least 1, got {samples}")
    big_n = samples or _answer_count(path, rows[0], 0)
    prompts, answers, gold = [], [], []
    for index, row in enumerate(rows):
        prompt, texts, scores = _checked(path, index, row, big_n, samples is not None)
        prompts.append(prompt)
        answers.append(texts)
        gold.append(scores)
    return GoldGenerations(prompts, answers, np.asarray(gold, dtype=np.float64))


def _rows(path: Path) -> list[Any]:
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    if path.suffix not in SUFFIXES:
        raise DatasetError(f"{path}: expected a {', '.join(SUFFIXES)} file of gold-labelled rows")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
    return rows


def _where(path: Path, index: int, field: str | None = None) -> str:
    return f"{path}: row {index + 1}" + (f": '{field}'" if field else "")


def _answer_count(path: Path, row: Any, index: int) -> int:
    answers = row.get("answers") if isinstance(row, dict) else None
    if not isinstance(answers, list) or not answers:
        raise DatasetError(f"{_where(path, index, 'answers')} must be a non-empty list of texts")
    return len(answers)


def _checked(
    path: Path, index: int, row: Any, big_n: int, cut: bool
) -> tuple[str, list[str], list[float]]:
    if not isinstance(row, dict):
        raise DatasetError(f"{_where(path, index)}: expected an object, got {type(row).__name__}")
    instruction, extra = row.get("instruction"), row.get("input") or ""
    if not isinstance(instruction, str) or not instruction.strip():
        raise DatasetError(f"{_where(path, index, 'instruction')} must be a non-empty text")
    if not isinstance(extra, str):
        raise DatasetError(f"{_where(path, index, 'input')} must be a text")
    count = _answer_count(path, row, index)
    answers, scores = row["answers"], row.get("gold_scores")
    if not isinstance(scores, list) or len(scores) != count:
        got = f"{len(scores)} scores" if isinstance(scores, list) else type(scores).__name__
        raise DatasetError(
            f"{_where(path, index, 'gold_scores')} must list one number per answer "
            f"({count}), got {got}"
        )
    if cut and count < big_n:
        raise DatasetError(
            f"{_where(path, index, 'answers')} has {count} answers, fewer than --samples {big_n}"
        )
    if not cut and count != big_n:
        raise DatasetError(
            f"{_where(path, index, 'answers')} has {count} answers where the first row has "
            f"{big_n}; pass --samples N to use every row's first N"
        )
    if not all(isinstance(a, str) for a in answers[:big_n]):
        raise DatasetError(f"{_where(path, index, 'answers')} must be texts")
    if not all(
        isinstance(s, int | float) and not isinstance(s, bool) and math.isfinite(s)
        for s in scores[:big_n]
    ):
        raise DatasetError(f"{_where(path, index, 'gold_scores')} must be finite numbers")
    prompt = f"{instruction}\n{extra}" if extra else instruction
    return prompt, answers[:big_n], [float(s) for s in scores[:big_n]]
