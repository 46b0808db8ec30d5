"""Countdown puzzles: reach a target with given numbers, each used exactly once.

A seeded generator after nlp-waseda/lbes `src/data_preprocessing/countdown.py`
(docs/algorithms.md, "Tasks and rewards"): numbers are drawn from 1-99; the
target is the value of a random expression over all of them, built by repeatedly combining
two random items with the next operator from a pool that holds + - * / equally often, with
intermediate denominators bounded by 99 * 99 and an integer result in 1-999; puzzles are
deduplicated by (sorted numbers, target). Defaults: 8192 train and 1024 test puzzles, seed 42.

Differences from the reference:
- Each draw of numbers gets one random expression (the reference tries up to 100 on each
  of up to 1,000 draws). Four numbers under * * * succeed only when their product is at most
  999, about once in 1,500 draws, so with the reference's limits four-number generation
  gives up; here a puzzle may take up to MAX_DRAWS draws.
- The test split is deduplicated against the train split too (the reference dedups each
  split on its own, so they may overlap).
- Each puzzle keeps the expression it was built from as its solution (in `metadata`), and
  the countdown reward checks that it scores as correct, so every puzzle is solvable.
- The system prompt is ES Lab's own text, not the reference's. For LBES's exact data, its
  shipped `data/countdown3/train.parquet` and `test.parquet` load as they are.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.data.datasets import DatasetError, Example, WriteResult, write_dataset
from engine.rewards import countdown as countdown_reward

DEFAULT_N_TRAIN = 8192
DEFAULT_N_TEST = 1024
DEFAULT_SEED = 42
MIN_NUMBER, MAX_NUMBER = 1, 99
MIN_TARGET, MAX_TARGET = 1, 999
# The reference's bound: no intermediate value finer than 1 / (99 * 99).
MAX_DENOMINATOR = 99 * 99
# Draws of (numbers, expression) per puzzle before giving up. The rarest case, four numbers
# under * * *, succeeds about once in 1,500 draws (product <= 999).
MAX_DRAWS = 100_000
OPS = ("+", "-", "*", "/")
ANSWER_EXAMPLE = "(1 + 2) / 3"

SYSTEM_PROMPT = f"""You solve arithmetic puzzles. Combine the given numbers to reach the \
target number.

Rules:
- Use every given number exactly once, and no other numbers.
- Use only +, -, * and /, with parentheses as needed.
- First reason step by step inside <think></think> tags.
- Then write only the final expression inside <answer></answer> tags, for example \
<answer>{ANSWER_EXAMPLE}</answer>. Do not write "=" or the result in the answer."""

USER_PROMPT = "Given numbers: {numbers}\nTarget number: {target}"


@dataclass(frozen=True)
class Puzzle:
    numbers: tuple[int, ...]
    target: int
    solution: str


# (numerator, denominator, text) of an intermediate result. Plain integers rather than
# Fraction: generation evaluates about half a million random expressions for four numbers,
# and Fraction would make it take seconds more.
_Expr = tuple[int, int, str]


def generate_countdown(
    n_given_numbers: int,
    out_dir: str | Path,
    *,
    n_train: int = DEFAULT_N_TRAIN,
    n_test: int = DEFAULT_N_TEST,
    seed: int = DEFAULT_SEED,
) -> WriteResult:
    """Write `out_dir/train.parquet` and `out_dir/test.parquet` (disjoint puzzles)."""
    train, test = generate_splits(n_given_numbers, n_train=n_train, n_test=n_test, seed=seed)
    out_dir = Path(out_dir)
    paths = [
        write_dataset([to_example(p) for p in train], out_dir / "train.parquet"),
        write_dataset([to_example(p) for p in test], out_dir / "test.parquet"),
    ]
    summary = (
        f"countdown with {n_given_numbers} numbers (seed {seed}): {len(train)} train and "
        f"{len(test)} test puzzles in {out_dir}"
    )
    return WriteResult(paths, summary)


def generate_splits(
    n_given_numbers: int, *, n_train: int, n_test: int, seed: int
) -> tuple[list[Puzzle], list[Puzzle]]:
    """Seeded train and test puzzles; no (sorted numbers, target) appears twice."""
    if n_given_numbers < 2:
        raise DatasetError(f"n_given_numbers must be at least 2, got {n_given_numbers}")
    for name, count in (("n_train", n_train), ("n_test", n_test)):
        if count < 1:
            raise DatasetError(f"{name} must be at least 1, got {count}")
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    train = _generate(n_train, n_given_numbers, rng, seen)
    test = _generate(n_test, n_given_numbers, rng, seen)
    return train, test


def to_example(puzzle: Puzzle) -> Example:
    user = USER_PROMPT.format(numbers=", ".join(map(str, puzzle.numbers)), target=puzzle.target)
    return Example(
        prompt=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
        reward_func_args={"target": puzzle.target, "numbers": list(puzzle.numbers)},
        metadata={"solution": puzzle.solution},
    )


def _generate(
    count: int, n_numbers: int, rng: random.Random, seen: set[tuple[tuple[int, ...], int]]
) -> list[Puzzle]:
    n_ops = n_numbers - 1
    pool = _op_pool(count * n_ops, rng)
    puzzles = []
    for index in range(count):
        puzzle = _new_puzzle(pool[index * n_ops : (index + 1) * n_ops], n_numbers, rng, seen)
        _check_solvable(puzzle)
        puzzles.append(puzzle)
    return puzzles


def _op_pool(size: int, rng: random.Random) -> list[str]:
    """`size` operators, each of + - * / equally often (the remainder drawn at random)."""
    base, remainder = divmod(size, len(OPS))
    pool = [op for op in OPS for _ in range(base)] + rng.sample(OPS, remainder)
    rng.shuffle(pool)
    return pool


def _new_puzzle(
    ops: list[str], n_numbers: int, rng: random.Random, seen: set[tuple[tuple[int, ...], int]]
) -> Puzzle:
    span = MAX_NUMBER - MIN_NUMBER + 1
    # random() is several times faster than randint(), which matters at half a million
    # draws for four numbers.
    uniform = rng.random
    for _ in range(MAX_DRAWS):
        numbers = tuple([MIN_NUMBER + int(uniform() * span) for _ in range(n_numbers)])
        expr = random_expression(numbers, ops, uniform)
        if expr is None:
            continue
        numerator, denominator, text = expr
        key = (tuple(sorted(numbers)), numerator)
        if denominator != 1 or not MIN_TARGET <= numerator <= MAX_TARGET or key in seen:
            continue
        seen.add(key)
        # The outermost operation's parentheses are redundant in the answer.
        return Puzzle(numbers, numerator, text[1:-1])
    raise DatasetError(
        f"no new countdown puzzle with {n_numbers} numbers and operators {ops} after "
        f"{MAX_DRAWS} draws; ask for fewer puzzles"
    )


def random_expression(
    numbers: tuple[int, ...], ops: list[str], uniform: Callable[[], float]
) -> _Expr | None:
    """Combine two random items with each operator in turn until one item is left; None when
    a division by zero or a denominator over the bound comes up."""
    items: list[_Expr] = [(n, 1, str(n)) for n in numbers]
    for op in ops:
        # An ordered pair, so for - and / either operand order is equally likely.
        i = int(uniform() * len(items))
        j = int(uniform() * (len(items) - 1))
        j += j >= i
        combined = _combine(items[i], items[j], op)
        if combined is None or combined[1] > MAX_DENOMINATOR:
            return None
        for k in sorted((i, j), reverse=True):
            del items[k]
        items.append(combined)
    return items[0]


def _combine(a: _Expr, b: _Expr, op: str) -> _Expr | None:
    """a op b on reduced fractions (numerator, positive denominator); None for x / 0."""
    (an, ad, a_text), (bn, bd, b_text) = a, b
    if op == "+":
        numerator, denominator = an * bd + bn * ad, ad * bd
    elif op == "-":
        numerator, denominator = an * bd - bn * ad, ad * bd
    elif op == "*":
        numerator, denominator = an * bn, ad * bd
    elif bn == 0:
        return None
    else:
        numerator, denominator = an * bd * (1 if bn > 0 else -1), ad * abs(bn)
    g = math.gcd(numerator, denominator)
    return numerator // g, denominator // g, f"({a_text} {op} {b_text})"


def _check_solvable(puzzle: Puzzle) -> None:
    completion = f"<think>x</think><answer>{puzzle.solution}</answer>"
    score = countdown_reward.compute_score(completion, target=puzzle.target, numbers=puzzle.numbers)
    if score["accuracy"] != 1.0:
        raise DatasetError(
            f"internal error: the solution {puzzle.solution!r} of puzzle {puzzle} does not "
            f"score as correct ({score})"
        )
