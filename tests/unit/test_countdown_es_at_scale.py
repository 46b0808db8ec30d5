"""ES at Scale's countdown grader: engine.rewards.countdown_es_at_scale against golden values
of the reference (VsonicV/es-at-scale, es_at_scale/reward_function/countdown_grader.py,
`countdown_reward_fn`), on random and crafted completions; they must agree exactly.

The reference is under a non-commercial licence, so none of its code is in this repository;
tests/unit/data/countdown_es_at_scale_golden.jsonl holds what it returned (upstream commit
574a9d1, Python 3.11). Each line is one case: its inputs (`completion`, `numbers`, `target`,
the target as a number or as text, as the reference's data gives it), `kind` ("crafted",
"large_power" or "random") and the reference's `reward`, `format_reward` and `answer_reward`.
The crafted rows are CRAFTED below, in order, with NUMBERS; the large-power row is the one
test_a_large_power_within_the_bound_is_computed_as_the_reference_does names. The random rows
come from 20,000 random completions (countdown-like text built from think/answer tags and
random arithmetic over 2 to 4 numbers, sometimes slightly wrong, with targets that are often
reachable, non-integers included; seed 20260611): every one the reference scored as answered
(241, 41 of them with non-integer targets) and a seeded sample of the others, 1,500 in all, in
draw order. A new random set is fine too, as long as it still reaches every branch (the test
counts them).

To regenerate the expected values, in a scratch directory outside this repository: fetch the
reference's countdown_grader.py, and for each line of the fixture call its
`countdown_reward_fn(completion, {"numbers": numbers, "target": target})`, which returns
`(parts, reward)`; write back `reward`, `parts["format_reward"]` and `parts["answer_reward"]`,
keeping the inputs, as compact JSON, one line a case (floats written as Python's json writes
them, so they read back exactly; the SyntaxWarning its `eval` gives "(44)(19)" is harmless).
To add a case, append its inputs and do the same; a crafted case goes both into CRAFTED and,
at the same place, into the fixture.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from engine.rewards import BUILTIN_REWARDS, load_reward_function, score_completion
from engine.rewards.countdown_es_at_scale import MAX_DEPTH, MAX_POWER_BITS, compute_score

GOLDEN_FILE = Path(__file__).parent / "data" / "countdown_es_at_scale_golden.jsonl"
STALE = f"{GOLDEN_FILE.name} does not hold this test's inputs: regenerate it (see the docstring)"


def _load_golden() -> list[dict[str, Any]]:
    with GOLDEN_FILE.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


GOLDEN = _load_golden()


def golden_rows(kind: str) -> list[dict[str, Any]]:
    return [row for row in GOLDEN if row["kind"] == kind]


def expected_of(row: dict[str, Any]) -> dict[str, float]:
    """The reference's scores for the row."""
    return {
        "reward": row["reward"],
        "format_reward": row["format_reward"],
        "answer_reward": row["answer_reward"],
        # its evaluation scripts' "Accuracy (answer_reward > 0)"
        "accuracy": float(row["answer_reward"] > 0),
    }


def scores_of(row: dict[str, Any]) -> dict[str, float]:
    """ES Lab's scores for the row's inputs."""
    return compute_score(row["completion"], numbers=row["numbers"], target=row["target"])


def test_agrees_with_the_reference_on_random_completions():
    rows = golden_rows("random")
    disagreements = []
    for row in rows:
        ours, reference = scores_of(row), expected_of(row)
        if ours != reference:
            disagreements.append(
                (row["completion"], row["numbers"], row["target"], ours, reference)
            )
    assert not disagreements, (len(disagreements), disagreements[:5])
    counts = {
        "answer": sum(row["answer_reward"] == 1.0 for row in rows),
        "partial_format": sum(row["format_reward"] in (0.5, 0.6) for row in rows),
        "full_format": sum(row["format_reward"] == 1.0 for row in rows),
        "non_integer_target": sum(
            row["answer_reward"] == 1.0 and "." in str(row["target"]) for row in rows
        ),
    }
    # The inputs reach every branch, not only the zeros.
    assert all(count >= 20 for count in counts.values()), counts


NUMBERS = [44, 19, 35]

CRAFTED = [
    # (completion, target): the reference's prompt ends in "<think>", so completions start
    # inside the think block.
    (" 44 + 19 = 63, 63 + 35 = 98</think>\n<answer>44 + 19 + 35</answer>", "98"),
    (" 44 + 19 = 63</think>\n<answer>44 + 19 + 35</answer>\n", "98"),  # $ before a final \n
    (" 44 + 19 = 63</think>\n<answer>44 + 19 + 35</answer>\n\n", "98"),
    (" hm</think> <answer>44 + 19 + 35</answer>", "98"),  # no newline: partial credit
    ("<answer>1</answer> then <answer>44+19+35</answer>", 98),  # the last answer counts
    ("<answer>44+19+35</answer> then <answer>1</answer>", 98),
    (" x</think>\n<answer>(44 - 19) / 35</answer>", "0.7142857142857143"),
    (" x</think>\n<answer>(44 - 19) / 35</answer>", "0.71428"),  # within 1e-5
    (" x</think>\n<answer>(44 - 19) / 35</answer>", "0.7142"),  # not within 1e-5
    (" x</think>\n<answer>(44 - 19) / 35</answer>", 0.7142857142857143),
    (" x</think>\n<answer>44 // 19 + 35</answer>", "37"),
    (" x</think>\n<answer>44 ** 0 * 19 + 35</answer>", "54"),
    (" x</think>\n<answer>35 - 44 - 19</answer>", "-28"),
    (" x</think>\n<answer>- - -44 + 19 + 35</answer>", "10"),
    (" x</think>\n<answer>" + "-" * 900 + "44 + 19 + 35</answer>", "98"),
    (" x</think>\n<answer>" + "-" * 5000 + "44 + 19 + 35</answer>", "98"),
    (" x</think>\n<answer>44 / (19 - 19) + 35</answer>", "98"),
    (" x</think>\n<answer>(-44) ** (1 / 2) + 19 + 35</answer>", "98"),  # complex: 0
    (" x</think>\n<answer>44 + 19 + 35 + ()</answer>", "98"),
    (" x</think>\n<answer>()</answer>", "0"),
    (" x</think>\n<answer>(44)(19) + 35</answer>", "98"),
    (" x</think>\n<answer>044 + 19 + 35</answer>", "98"),
    (" x</think>\n<answer>44 + 19 + 35 = 98</answer>", "98"),
    (" x</think>\n<answer>44 + 19 + 35.0</answer>", "98"),
    (" x</think>\n<answer></answer>", "98"),
    (" x</think>\n<answer>   </answer>", "98"),
    (" x</think>\n<answer>44 + 19</answer>", "63"),  # a number unused
    (" x</think>\n<answer>44 + 19 + 35 + 35 - 35</answer>", "98"),  # one used twice
    (" x</think>\n<answer>" + "(" * 201 + "44+19+35" + ")" * 201 + "</answer>", "98"),
    ("</think>\n<answer>44+19+35</answer>", "98"),  # an empty think block is full format
    ("", "98"),
    ("<think>", "98"),
    ("\n<answer>44+19+35</answer><think>x</think>", "98"),
    (" x</think>\n<answer>44\n+19+35</answer>", "98"),
    (" x</think>\n<answer>44\t+19+35</answer>", "98"),
    (" x</think>\n<answer>٤٤ + 19 + 35</answer>", "98"),  # other digits
]


@pytest.mark.parametrize(
    ("index", "completion", "target"), [(i, *c) for i, c in enumerate(CRAFTED)]
)
def test_agrees_with_the_reference_on_crafted_completions(index, completion, target):
    rows = golden_rows("crafted")
    assert len(rows) == len(CRAFTED), STALE
    row = rows[index]
    inputs = (row["completion"], row["numbers"], row["target"], type(row["target"]))
    assert inputs == (completion, NUMBERS, target, type(target)), STALE
    assert scores_of(row) == expected_of(row)


def test_the_reference_example_scores_as_the_reference_says():
    completion = " 44 + 19 = 63, 63 + 35 = 98</think>\n<answer>(44 + 19) + 35</answer>"
    assert compute_score(completion, numbers=NUMBERS, target="98") == {
        "reward": 1.1,
        "format_reward": 1.0,
        "answer_reward": 1.0,
        "accuracy": 1.0,
    }
    partial = compute_score("<answer>(44 + 19) + 35</answer>", numbers=NUMBERS, target="98")
    assert partial == {
        "reward": 0.1 * 0.5 + 1.0,
        "format_reward": 0.5,
        "answer_reward": 1.0,
        "accuracy": 1.0,
    }


@pytest.mark.parametrize(
    "expression", ["99 ** 99 ** 99", "2 ** 99 ** 99", "(99 ** 99) ** 99 ** 9", "1 / 99 ** 99 ** 99"]
)
def test_a_power_too_large_to_compute_scores_zero_at_once(expression):
    """The reference computes these for as long as it takes (its trainer's timeout then
    scores 0); here they score 0 at once."""
    numbers = [int(n) for n in re.findall(r"\d+", expression)]
    start = time.perf_counter()
    score = compute_score(f"x</think>\n<answer>{expression}</answer>", numbers=numbers, target=0)
    assert score["answer_reward"] == 0.0
    assert time.perf_counter() - start < 1.0
    assert MAX_POWER_BITS >= 99 * 99 * 7  # powers of the inputs' size are computed


def test_a_large_power_within_the_bound_is_computed_as_the_reference_does():
    # 2 ** 970299: close to MAX_POWER_BITS, and quick for the reference's eval too.
    (row,) = golden_rows("large_power")
    assert (row["completion"], row["numbers"], row["target"]) == (
        "x</think>\n<answer>2 ** 99 ** 3 // (2 ** 99 ** 3)</answer>",
        [2, 99, 3, 2, 99, 3],
        "1",
    ), STALE
    assert scores_of(row) == expected_of(row)
    assert row["answer_reward"] == 1.0


def test_a_digit_run_longer_than_int_reads_scores_zero():
    """The reference raises here (int() of over 4300 digits, outside its try)."""
    completion = f"x</think>\n<answer>{'9' * 5000} + 1</answer>"
    assert compute_score(completion, numbers=[1, 2], target=3)["answer_reward"] == 0.0


def test_the_format_prefix_is_a_per_row_argument():
    """A dataset whose prompts do not end in <think> gives "" (or its own prefix)."""
    completion = "x</think>\n<answer>44+19+35</answer>"
    assert compute_score(completion, numbers=NUMBERS, target=98)["format_reward"] == 1.0
    scores = compute_score(completion, numbers=NUMBERS, target=98, format_prefix="")
    assert scores == {
        "reward": 0.1 * 0.5 + 1.0,
        "format_reward": 0.5,
        "answer_reward": 1.0,
        "accuracy": 1.0,
    }


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"numbers": [1, 2], "target": "abc"}, "target must be a number or its text, got 'abc'"),
        ({"numbers": [1, 2], "target": "nan"}, "target must be a finite number"),
        ({"numbers": [1, 2], "target": True}, "target must be a number or its text"),
        ({"numbers": [1, "2"], "target": 3}, "numbers must be whole numbers"),
        ({"numbers": [1, 2.0], "target": 3}, "numbers must be whole numbers"),
    ],
)
def test_bad_arguments_stop_the_run_naming_the_sample(args, problem):
    func = load_reward_function(BUILTIN_REWARDS["countdown_es_at_scale"])
    with pytest.raises(Exception, match=re.escape(problem)) as excinfo:
        score_completion(func, "<answer>1+2</answer>", args, sample_description="prompt 3")
    assert "prompt 3" in str(excinfo.value)


def test_nesting_is_bounded_alike_under_a_raised_recursion_limit():
    """The reference's eval fails past what Python's default recursion limit allows; a library
    that raised the process's limit (the suite's CI saw one) must not let a deeper answer
    compute here."""
    import sys

    def score(signs: int) -> float:
        completion = f"x</think>\n<answer>{'+' * signs}98</answer>"
        return compute_score(completion, numbers=[98], target="98")["answer_reward"]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        assert score(MAX_DEPTH - 1) == 1.0  # the signs and the number: MAX_DEPTH deep
        assert score(MAX_DEPTH) == 0.0
        assert score(5000) == 0.0
    finally:
        sys.setrecursionlimit(limit)
