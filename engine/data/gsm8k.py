"""GSM8K to an ES Lab dataset.

Converts a local file in the GSM8K JSON-lines format (one {"question": ..., "answer": ...}
object per line, the answer ending in "#### <number>") into the dataset format, in the form
of nlp-waseda/lbes `src/data_preprocessing/gsm8k.py` (docs/algorithms.md, "Tasks and
rewards"): a system prompt asking for <think></think> and <answer></answer>, the question as
the user message, and `reward_func_args = {"ground_truth": <text after the last ####>}`,
commas stripped. The system prompt is ES Lab's own text (SYSTEM_PROMPT), not the reference's:
for LBES's exact data, its shipped `data/gsm8k/train.parquet` and `test.parquet` load as they
are (engine.data.datasets reads their struct columns).

No dataset hub is reachable here, so the input is a file the user provides. A final answer
that is not an integer is refused: the gsm8k reward only reads integers, so that problem
could never be solved. The worked solution is kept in `metadata`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.data.datasets import DatasetError, Example, WriteResult, json_lines, write_dataset

SYSTEM_PROMPT = """You solve grade-school math word problems.

First think the problem through step by step inside <think></think> tags: work out what is \
asked, compute each intermediate quantity, and check your arithmetic. After </think>, \
explain the solution briefly and give the final numerical answer inside <answer></answer> \
tags. The answer tags must contain only the number, for example <answer>42</answer>."""

ANSWER_SEPARATOR = "####"
_INTEGER = re.compile(r"-?\d+")


def convert_gsm8k(input_jsonl: str | Path, out_path: str | Path) -> WriteResult:
    """Convert a GSM8K JSON-lines file into a parquet dataset at `out_path`."""
    input_jsonl = Path(input_jsonl)
    examples = read_gsm8k(input_jsonl)
    path = write_dataset(examples, out_path)
    return WriteResult([path], f"gsm8k: {len(examples)} problems from {input_jsonl} in {path}")


NEEDS = ("question", "answer")


def read_gsm8k(path: Path) -> list[Example]:
    """Parse every non-blank line; errors name the file and the (1-based) line."""
    return [parse_record(record, where) for where, record in json_lines(path, NEEDS, "problems")]


def parse_record(record: dict, where: str) -> Example:
    """One GSM8K record -> Example; raises DatasetError prefixed with `where`."""
    answer = record["answer"]
    if ANSWER_SEPARATOR not in answer:
        raise DatasetError(
            f"{where}: the answer has no '{ANSWER_SEPARATOR}' before the final number"
        )
    ground_truth = answer.rsplit(ANSWER_SEPARATOR, 1)[1].strip().replace(",", "")
    if _INTEGER.fullmatch(ground_truth) is None:
        raise DatasetError(
            f"{where}: the final answer {ground_truth!r} is not an integer, which the gsm8k "
            "reward could never match"
        )
    return Example(
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": record["question"]},
        ],
        reward_func_args={"ground_truth": ground_truth},
        metadata={"solution": answer},
    )
