"""Countdown as ES at Scale ships it (VsonicV/es-at-scale), generated with a seed.

The reference's data is one file of 2200 puzzles, `archive/countdown/data/countdown.json`
(its `datasets/train/countdown` holds the first 200, `datasets/evaluation_suite/countdown`
the last 2000): a list of {id, context, numbers, target, solution}. Each has 3 or 4 numbers
from 1-99 (repeats allowed), about half each; the target is text, an integer from 1 to 100
for 2119 puzzles and otherwise negative, above 100 or a non-integer such as "27.4", written
as Python prints the value of the solution; the solution is fully parenthesised, such as
"((44 + 19) + 35)"; and `context` is the raw prompt, with no chat template, ending in
"<think>", the numbers printed as NumPy prints an array (its scripts read them back from
there).

The reference's own file converts as it is (engine.data.countdown_es_at_scale_file, `eslab
data countdown --format es-at-scale --input FILE`), with its own prompts: that is the route to
its experiment. Without it, this module writes puzzles of the same kind: the count of numbers
drawn 3 or 4, the numbers uniform in 1-99, the solution a random expression over all of them
(engine.data.countdown.random_expression, operators drawn uniformly), and the target its
value; a puzzle is off the 1-100 grid with the reference's share (81 of 2200), within
+-MAX_ABS_TARGET. No (sorted numbers, target) appears twice, and every solution is checked to
score as correct under the reference's grader (engine.rewards.countdown_es_at_scale); in the
reference's file 19 puzzles have no solution and 15 list one over other numbers. The splits
are the reference's: the first 200 puzzles train, the next 2000 test. The distribution of
targets and operators differs from the reference's file (docs/algorithms.md, "Tasks and
rewards").

The prompt is ES Lab's own text (PROMPT), not the reference's: of the same form (raw text
asking for <think> and <answer> blocks, ending in "<think>", the numbers first in brackets as
NumPy prints them, so the reference's scripts can read this countdown.json).

Written to a folder: `countdown.json` in the reference's layout (train then test, so the
reference's own scripts, which take [0:200] and [-2000:], read it), and `train.parquet` and
`test.parquet`, ES Lab datasets of raw prompts (prompt_format: raw) whose reward_func_args
are the reference grader's {numbers, target}, with {id, solution} kept as metadata.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.data.countdown import MAX_NUMBER, MIN_NUMBER, OPS, random_expression
from engine.data.datasets import (
    DatasetError,
    Example,
    WriteResult,
    write_atomically,
    write_dataset,
)
from engine.rewards import countdown_es_at_scale as grader

DEFAULT_N_TRAIN = 200
DEFAULT_N_TEST = 2000
DEFAULT_SEED = 42
NUMBER_COUNTS = (3, 4)
GRID = (1, 100)
# The reference's file: 81 of its 2200 targets are not an integer from 1 to 100.
OFF_GRID_SHARE = 81 / 2200
# Its off-grid targets lie within -2640..1349.
MAX_ABS_TARGET = 3000
MAX_DRAWS = 100_000
JSON_NAME = "countdown.json"

PROMPT = (
    "Countdown puzzle. Numbers: {numbers}. Target: {target}.\n"
    "Write one arithmetic expression that uses each of the numbers exactly once, with +, -, * "
    "and / and parentheses, and whose value is the target. Think it over between <think> and "
    "</think>, then give the expression alone between <answer> and </answer>, for instance "
    "<answer> (7 - 2) * 3 </answer>.\n<think>"
)
"""ES Lab's countdown prompt in ES at Scale's form: raw text ending in "<think>", which the
grader's format check puts back in front of the completion."""


@dataclass(frozen=True)
class Item:
    """One puzzle in the reference's layout (its JSON keys)."""

    id: int
    context: str
    numbers: list[int]
    target: str
    solution: str


def generate_countdown_es_at_scale(
    out_dir: str | Path,
    *,
    n_train: int = DEFAULT_N_TRAIN,
    n_test: int = DEFAULT_N_TEST,
    seed: int = DEFAULT_SEED,
    n_given_numbers: int | None = None,
) -> WriteResult:
    """Write `countdown.json`, `train.parquet` and `test.parquet` into `out_dir`.
    `n_given_numbers` keeps every puzzle at 3 or 4 numbers; None mixes them, as the reference."""
    for name, count in (("n_train", n_train), ("n_test", n_test)):
        if count < 1:
            raise DatasetError(f"{name} must be at least 1, got {count}")
    items = generate_items(n_train + n_test, seed=seed, n_given_numbers=n_given_numbers)
    out_dir = Path(out_dir)
    train, test = items[:n_train], items[n_train:]
    paths = [
        _write_json(items, out_dir / JSON_NAME),
        write_dataset([to_example(i) for i in train], out_dir / "train.parquet"),
        write_dataset([to_example(i) for i in test], out_dir / "test.parquet"),
    ]
    summary = (
        f"countdown as ES at Scale ships it (seed {seed}): {len(train)} train and {len(test)} "
        f"test puzzles in {out_dir} ({JSON_NAME}, train.parquet, test.parquet; "
        "prompt_format: raw)"
    )
    return WriteResult(paths, summary)


def generate_items(count: int, *, seed: int, n_given_numbers: int | None = None) -> list[Item]:
    """`count` seeded puzzles, ids 0..count-1; no (sorted numbers, target) twice."""
    if n_given_numbers is not None and n_given_numbers not in NUMBER_COUNTS:
        raise DatasetError(
            f"n_given_numbers must be 3 or 4 (or unset, to mix them), got {n_given_numbers}"
        )
    counts = NUMBER_COUNTS if n_given_numbers is None else (n_given_numbers,)
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], str]] = set()
    return [_new_item(index, rng.choice(counts), rng, seen) for index in range(count)]


def to_example(item: Item) -> Example:
    return Example(
        prompt=item.context,
        reward_func_args={"numbers": list(item.numbers), "target": item.target},
        metadata={"id": item.id, "solution": item.solution},
    )


def numbers_text(numbers: list[int]) -> str:
    """As NumPy prints an integer array, which the reference's prompts show: "[ 2 54 17]"."""
    width = max(len(str(n)) for n in numbers)
    return "[" + " ".join(str(n).rjust(width) for n in numbers) + "]"


def context(numbers: list[int], target: str) -> str:
    """ES Lab's prompt of one puzzle."""
    return PROMPT.format(numbers=numbers_text(numbers), target=target)


def _new_item(
    index: int, n_numbers: int, rng: random.Random, seen: set[tuple[tuple[int, ...], str]]
) -> Item:
    off_grid = rng.random() < OFF_GRID_SHARE
    for _ in range(MAX_DRAWS):
        numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(n_numbers)]
        ops = [rng.choice(OPS) for _ in range(n_numbers - 1)]
        expr = random_expression(tuple(numbers), ops, rng.random)
        if expr is None:
            continue
        numerator, denominator, solution = expr
        on_grid = denominator == 1 and GRID[0] <= numerator <= GRID[1]
        if on_grid == off_grid or abs(numerator) > MAX_ABS_TARGET * denominator:
            continue
        target = target_text(numerator, denominator, solution)
        key = (tuple(sorted(numbers)), target)
        if key in seen:
            continue
        seen.add(key)
        item = Item(index, context(numbers, target), numbers, target, solution)
        _check_solvable(item)
        return item
    raise DatasetError(f"no new countdown puzzle after {MAX_DRAWS} draws; ask for fewer puzzles")


def target_text(numerator: int, denominator: int, solution: str) -> str:
    """An integer as itself; otherwise the value Python computes for the solution, as
    Python prints it ("266.6666666666667"), as the reference's targets are written."""
    if denominator == 1:
        return str(numerator)
    return str(float(grader.evaluate(solution)))


def _check_solvable(item: Item) -> None:
    completion = f" I combine them.</think>\n<answer>{item.solution}</answer>"
    score = grader.compute_score(completion, numbers=item.numbers, target=item.target)
    if score["answer_reward"] != 1.0:
        raise DatasetError(
            f"internal error: the solution of puzzle {item} does not score as correct ({score})"
        )


def _write_json(items: list[Item], path: Path) -> Path:
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; it is where {JSON_NAME} is written")
    text = json.dumps([asdict(i) for i in items], indent=2)
    write_atomically(path, lambda partial: partial.write_text(text, encoding="utf-8"))
    return path
