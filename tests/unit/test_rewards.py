"""Rewards: hand-computed scores of the built-ins, and the loader's and scorer's errors."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from engine.rewards import (
    BUILTIN_REWARDS,
    REWARD_MODULES_SETTING,
    RewardError,
    conciseness,
    countdown,
    gsm8k,
    load_reward_function,
    score_completion,
)

CORRECT = {"reward": 1.1, "format": 0.1, "accuracy": 1.0}  # the reference's parts
WRONG = {"reward": 0.1, "format": 0.1, "accuracy": 0.0}
INVALID = {"reward": 0.0, "format": 0.0, "accuracy": 0.0}


def countdown_score(answer: str, target: int, numbers: list[int]) -> dict:
    return countdown.compute_score(
        f"<think>Let me try.</think>\n<answer>{answer}</answer>", target=target, numbers=numbers
    )


# --- countdown ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "target", "numbers", "expected"),
    [
        ("(75 * 2) + 19", 169, [19, 75, 2], CORRECT),  # 150 + 19
        ("75*2+19", 169, [19, 75, 2], CORRECT),  # spacing does not matter
        ("  19 + 75 * 2  ", 169, [19, 75, 2], CORRECT),  # answer is stripped
        ("-3 + 5", 2, [3, 5], CORRECT),  # unary minus is allowed
        ("+3 - -5", 8, [3, 5], CORRECT),  # so is unary plus
        ("(75 * 2) - 19", 169, [19, 75, 2], WRONG),  # 131: valid but wrong
        ("75 * 2 + 18", 168, [19, 75, 2], INVALID),  # 18 is not a given number
        ("75 * 2", 150, [19, 75, 2], INVALID),  # 19 unused
        ("75 * 2 + 19 + 19", 188, [19, 75, 2], INVALID),  # 19 used twice
        ("6 * 6", 36, [6, 3], INVALID),  # 6 reused instead of 3
        ("6 + 3 + 3", 12, [6, 3, 3], CORRECT),  # duplicates in numbers: a multiset
        ("6 + 3", 9, [6, 3, 3], INVALID),  # one 3 missing
        ("75 * 2 + 19 = 169", 169, [19, 75, 2], INVALID),  # '=' is not allowed
        ("75 x 2 + 19", 169, [19, 75, 2], INVALID),  # 'x' is not allowed
        ("75.0 * 2 + 19", 169, [19, 75, 2], INVALID),  # '.' is not allowed
        ("2 ** 3", 8, [2, 3], INVALID),  # allowed characters, but Pow is not whitelisted
        ("7 // 2", 3, [7, 2], INVALID),  # FloorDiv is not whitelisted
        ("3 / (5 - 5)", 3, [5, 5, 3], INVALID),  # division by zero: invalid, not a crash
        ("05 + 3", 8, [5, 3], INVALID),  # leading zero: a syntax error
        ("(5 + 3", 8, [5, 3], INVALID),  # unbalanced parenthesis
        ("5 3", 8, [5, 3], INVALID),  # not an expression
    ],
)
def test_countdown_scores(answer, target, numbers, expected):
    assert countdown_score(answer, target, numbers) == pytest.approx(expected)


def test_countdown_is_exact_rational_arithmetic():
    # In floats 1 / 49 * 49 is 0.9999999999999999; exactly it is 1.
    assert 1 / 49 * 49 != 1
    assert countdown_score("1 / 49 * 49", 1, [1, 49, 49]) == pytest.approx(CORRECT)
    assert countdown_score("7 / 3 * 3", 7, [7, 3, 3]) == pytest.approx(CORRECT)
    # 1 + 1/1000000 is within the 1e-5 tolerance of the VsonicV grader, but not equal to 1.
    assert countdown_score("1 + 1 / 1000000", 1, [1, 1, 1000000]) == pytest.approx(WRONG)


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>5 + 3</answer>",  # no think block
        "<think>ok</think> 5 + 3",  # no answer block
        "<think></think><answer>5 + 3</answer>",  # empty think block
        "<answer>5 + 3</answer><think>ok</think>",  # wrong order
        "<think>ok</think><answer>5 + 3</answer><answer>5 + 3</answer>",  # two answers
        "<think>ok</think><think>ok</think><answer>5 + 3</answer>",  # two thinks
        "<think>ok <answer>1</answer></think><answer>5 + 3</answer>",  # answer tag inside
        "<think>ok</think><answer></answer>",  # empty answer
        "",
    ],
)
def test_countdown_needs_exactly_one_of_each_tag(completion):
    assert countdown.compute_score(completion, target=8, numbers=[5, 3]) == INVALID


def test_countdown_allows_text_around_the_tags():
    completion = "Sure.\n<think>5 + 3 is 8</think>\nSo:\n<answer>5 + 3</answer>\nDone."
    assert countdown.compute_score(completion, target=8, numbers=[5, 3]) == pytest.approx(CORRECT)


def test_countdown_accepts_numpy_arguments_as_parquet_gives_them():
    score = countdown_score("5 + 3", np.int64(8), np.array([5, 3]))
    assert score == pytest.approx(CORRECT)


def test_countdown_survives_pathological_answers():
    deep = "(" * 1000 + "3" + ")" * 1000
    unary = "-" * 100_000 + "3"
    assert countdown_score(deep, 3, [3]) == INVALID
    assert countdown_score(unary, 3, [3]) == INVALID


# --- gsm8k -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "ground_truth", "expected"),
    [
        ("<think>500 + 734</think>\nThe total is <answer>1,234</answer>.", "1234", CORRECT),
        ("<think>500 + 734</think><answer>1234</answer>", "1,234", CORRECT),
        ("<think>4 - 9</think><answer>-5</answer>", "-5", CORRECT),
        ("<think>4 - 9</think><answer>-5</answer>", -5, CORRECT),  # an int ground truth
        ("<think>3 * 12</think><answer>35</answer>", "36", WRONG),
        ("<think>x</think><answer>36.0</answer>", "36", INVALID),  # not an integer
        ("<think>x</think><answer>$36</answer>", "36", INVALID),
        ("<think>x</think><answer> 36 </answer>", "36", INVALID),  # no spaces in the tags
        ("The answer is 36.", "36", INVALID),
        ("Well, <think>x</think><answer>36</answer>", "36", INVALID),  # must start at <think>
        ("<think></think><answer>36</answer>", "36", INVALID),  # empty think block
        ("<think>x</think><answer>36</answer><answer>36</answer>", "36", INVALID),
    ],
)
def test_gsm8k_scores(completion, ground_truth, expected):
    score = gsm8k.compute_score(completion, ground_truth=ground_truth)
    assert score == pytest.approx(expected)


def reference_gsm8k(completion_text: str, ground_truth: str) -> dict[str, float]:
    """A copy of nlp-waseda/lbes `src/reward_funcs/gsm8k.py` `compute_score`."""
    import re

    pattern = re.compile(r"^<think>.+</think>.*<answer>(-?[\d,]*\d)</answer>.*$", re.DOTALL)
    match = pattern.match(completion_text)
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if match is None or any(completion_text.count(t) != 1 for t in tags):
        return {"reward": 0.0, "format": 0.0, "accuracy": 0.0}
    if match.group(1).replace(",", "") == ground_truth.replace(",", ""):
        return {"reward": 1.1, "format": 0.1, "accuracy": 1.0}
    return {"reward": 0.1, "format": 0.1, "accuracy": 0.0}


@pytest.mark.parametrize(
    "completion",
    [
        "<think>3 * 12</think><answer>36</answer>",
        "<think>3 * 12</think><answer>35</answer>",
        "<think>x</think><answer>3,6</answer>",
        "<think>x</think><answer>36.0</answer>",
        "no tags at all",
    ],
)
def test_gsm8k_parts_are_the_references_every_one(completion):
    """Every part, `format` included, on the reference's scale: its charts compare as they are."""
    assert gsm8k.compute_score(completion, ground_truth="36") == reference_gsm8k(completion, "36")


# --- conciseness -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "target", "reward"),
    [
        ("8", "8", 0.0),
        ("9", "8", 0.0),  # only the length counts
        ("The answer is 8.", "8", -15.0),  # 16 characters vs 1
        ("", "Paris", -5.0),  # too short counts too
        ("Carbon dioxide", "CO2", -11.0),
        ("élan", "abcd", 0.0),  # characters, not bytes
    ],
)
def test_conciseness_scores(completion, target, reward):
    score = conciseness.compute_score(completion, target=target)
    assert score == {"reward": reward, "length": float(len(completion))}


# --- the registry and the loader ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTIN_REWARDS))
def test_every_builtin_loads_and_scores(name):
    func = load_reward_function(BUILTIN_REWARDS[name])
    assert BUILTIN_REWARDS[name] == f"engine.rewards.{name}.compute_score"
    args = {
        "countdown": {"target": 8, "numbers": [5, 3]},
        "countdown_es_at_scale": {"target": "8", "numbers": [5, 3]},
        "gsm8k": {"ground_truth": "8"},
        "math_boxed": {"ground_truth": "8"},
        "conciseness": {"target": "8"},
    }[name]
    scores = score_completion(
        func, "<think>x</think><answer>8</answer>", args, sample_description="s"
    )
    assert set(scores) >= {"reward"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in scores.values())


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("engine.rewards.nope.compute_score", "has no module 'engine.rewards.nope'"),
        ("nowhere_at_all.compute_score", "is not in an allowed place"),
        # tests is allowed for the test session (tests/conftest.py)
        ("tests.nowhere_at_all.compute_score", "no module named 'tests.nowhere_at_all'"),
        ("engine.rewards.countdown.nope", "has no attribute 'nope'"),
        ("engine.rewards.countdown.FORMAT_REWARD", "not a function"),
        ("compute_score", "must be a dotted path"),
        ("", "must be a dotted path"),
    ],
)
def test_load_reward_function_errors_name_the_path(path, message):
    with pytest.raises(RewardError) as excinfo:
        load_reward_function(path)
    assert repr(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_load_reward_function_reports_a_broken_import(tmp_path, monkeypatch):
    (tmp_path / "broken_reward_module.py").write_text("import missing_dependency_of_reward\n")
    monkeypatch.setenv(REWARD_MODULES_SETTING, str(tmp_path))
    with pytest.raises(RewardError) as excinfo:
        load_reward_function("broken_reward_module.compute_score")
    message = str(excinfo.value)
    assert "importing 'broken_reward_module' failed" in message
    assert "missing_dependency_of_reward" in message
    sys.modules.pop("broken_reward_module", None)


# --- score_completion --------------------------------------------------------------------


def raising(completion_text, ground_truth=None):
    raise KeyError("ground_truth")


def returns_nan(completion_text, ground_truth=None):
    return {"reward": float("nan")}


def returns_inf_part(completion_text, ground_truth=None):
    return {"reward": 1.0, "format": float("inf")}


def returns_no_reward(completion_text, ground_truth=None):
    return {"score": 1.0}


def returns_float(completion_text, ground_truth=None):
    return 1.0


def returns_string_value(completion_text, ground_truth=None):
    return {"reward": "1.0"}


def returns_none_value(completion_text, ground_truth=None):
    return {"reward": None}


def takes_only_target(completion_text, *, target):
    return {"reward": 0.0}


@pytest.mark.parametrize(
    ("func", "problem"),
    [
        (raising, "raised KeyError"),
        (returns_nan, "reward=nan, which is not a finite number"),
        (returns_inf_part, "format=inf, which is not a finite number"),
        (returns_no_reward, "returned no 'reward' key"),
        (returns_float, "returned a float"),
        (returns_string_value, "reward='1.0', which is not a finite number"),
        (returns_none_value, "reward=None, which is not a finite number"),
        # refused before the call: ground_truth is not a parameter
        (takes_only_target, "is given reward_func_args ['ground_truth'] that are not its"),
    ],
)
def test_score_completion_never_turns_a_failure_into_zero(func, problem):
    with pytest.raises(RewardError) as excinfo:
        score_completion(
            func,
            "some completion",
            {"ground_truth": "7"},
            sample_description="train step 3, prompt 5",
        )
    message = str(excinfo.value)
    assert func.__qualname__ in message
    assert func.__module__ in message
    assert problem in message
    assert "train step 3, prompt 5" in message
    assert "'some completion'" in message


def test_score_completion_keeps_the_cause():
    with pytest.raises(RewardError) as excinfo:
        score_completion(raising, "x", {}, sample_description="s")
    assert isinstance(excinfo.value.__cause__, KeyError)


def test_score_completion_returns_floats_from_numpy_and_ints():
    def numpy_scores(completion_text):
        return {"reward": np.float32(0.5), "format": 1, "accuracy": np.int64(0)}

    scores = score_completion(numpy_scores, "x", {}, sample_description="s")
    assert scores == {"reward": 0.5, "format": 1.0, "accuracy": 0.0}
    assert all(type(v) is float for v in scores.values())


def test_score_completion_cuts_long_completions_in_messages():
    with pytest.raises(RewardError) as excinfo:
        score_completion(returns_nan, "y" * 10_000, {}, sample_description="s")
    assert len(str(excinfo.value)) < 1_000
    assert "10002 characters" in str(excinfo.value)  # repr adds the two quotes
