"""ES at Scale's countdown grader: engine.rewards.countdown_es_at_scale against a copy of the
reference's logic (VsonicV/es-at-scale, es_at_scale/reward_function/countdown_grader.py),
on random and crafted completions; they must agree exactly."""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest

from engine.rewards import BUILTIN_REWARDS, load_reward_function, score_completion
from engine.rewards.countdown_es_at_scale import MAX_POWER_BITS, compute_score

# The reference's eval warns of "(2)(3)" (a call of an int); its result is still an error.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

# --- a copy of the reference's logic (only the unused end_token argument left out) ----------


def ref_format_reward_function(response: str) -> float:
    think_regex = r"<think>.*?<\/think>"
    answer_regex = r"<answer>.*?<\/answer>"
    full_format_regex = r"^<think>.*?<\/think>\n<answer>.*?<\/answer>$"
    if re.match(full_format_regex, response, re.DOTALL):
        return 1.0
    reward = 0.0
    if re.search(think_regex, response, re.DOTALL):
        reward += 0.1
    if re.search(answer_regex, response, re.DOTALL):
        reward += 0.5
    return reward


def ref_answer_reward_function(response: str, numbers: list[int], target: Any) -> float:
    all_matches = re.findall(r"<answer>(.*?)<\/answer>", response, re.DOTALL)
    if not all_matches:
        return 0.0
    answer_content = all_matches[-1].strip()
    if not answer_content:
        return 0.0
    if not re.match(r"^[0-9+\-*/() ]+$", answer_content):
        return 0.0
    used_numbers = [int(n) for n in re.findall(r"\d+", answer_content)]
    if sorted(used_numbers) != sorted(numbers):
        return 0.0
    try:
        result = eval(answer_content, {"__builtins__": None}, {})  # the reference's own eval
        if abs(float(result) - float(target)) < 1e-5:
            return 1.0
    except Exception:
        return 0.0
    return 0.0


def ref_coerce_number(x: Any) -> Any:
    if isinstance(x, int | float):
        return x
    f = float(str(x).strip())
    return int(f) if f.is_integer() else f


def ref_countdown_reward_fn(model_response: str, gt_answer: dict) -> tuple[dict, float]:
    numbers, target_value = list(gt_answer["numbers"]), ref_coerce_number(gt_answer["target"])
    format_reward = ref_format_reward_function("<think>" + model_response)
    answer_reward = ref_answer_reward_function(model_response, numbers, target_value)
    fmt = {"format_reward": format_reward, "answer_reward": answer_reward}
    return fmt, 0.1 * format_reward + answer_reward


def assert_agrees(completion: str, numbers: list[int], target: Any) -> dict[str, float]:
    fmt, total = ref_countdown_reward_fn(completion, {"numbers": numbers, "target": target})
    ours = compute_score(completion, numbers=numbers, target=target)
    expected = {"reward": total, **fmt}
    assert ours == expected, (completion, numbers, target)
    return ours


# --- random completions ---------------------------------------------------------------------

OPS = ["+", "-", "*", "/", "+", "-", "*", "/", "//"]


def random_expression(rng: random.Random, numbers: list[int]) -> str:
    """A random arithmetic text over `numbers`, sometimes slightly wrong (a number missing or
    added, a leading zero, a tuple or a call, a stray character), with at most one power
    whose exponent is one literal, so the reference's eval always finishes quickly."""
    items = [str(n) for n in numbers]
    if rng.random() < 0.1:
        items.pop(rng.randrange(len(items)))
    if rng.random() < 0.1:
        items.append(str(rng.randint(1, 99)))
    if rng.random() < 0.05:
        items[0] = "0" + items[0]
    rng.shuffle(items)
    power_left = rng.random() < 0.15
    while len(items) > 1:
        i = rng.randrange(len(items) - 1)
        a, b = items[i], items[i + 1]
        op = rng.choice(OPS)
        if power_left and b.isdigit():
            op, power_left = "**", False
        if rng.random() < 0.2:
            b = "-" + b if rng.random() < 0.5 else "(-" + b + ")"
        text = f"{a} {op} {b}" if rng.random() < 0.5 else f"{a}{op}{b}"
        items[i : i + 2] = [f"({text})" if rng.random() < 0.7 else text]
    expression = items[0] if items else ""
    roll = rng.random()
    if roll < 0.03:
        expression += " + ()"
    elif roll < 0.06:
        expression = f"({expression})(2)"
    elif roll < 0.09:
        expression += " = " + str(rng.randint(1, 99))
    elif roll < 0.11:
        expression = f"  {expression}\n"
    return expression


def random_completion(rng: random.Random, numbers: list[int]) -> str:
    pieces = [
        lambda: "<think>",
        lambda: "</think>",
        lambda: "<answer>",
        lambda: "</answer>",
        lambda: "\n",
        lambda: " Let me try. ",
        lambda: random_expression(rng, numbers),
        lambda: f"<answer>{random_expression(rng, numbers)}</answer>",
        lambda: f"I add them.</think>\n<answer>{random_expression(rng, numbers)}</answer>",
        lambda: f" step</think>\n<answer> {random_expression(rng, numbers)} </answer>",
    ]
    return "".join(rng.choice(pieces)() for _ in range(rng.randint(0, 5)))


def reachable_target(rng: random.Random, numbers: list[int]) -> Any:
    """The reference's value of a valid expression of `numbers`, as the data file writes
    targets (text, non-integers included), or a random integer."""
    for _ in range(20):
        expression = random_expression(rng, numbers)
        try:
            value = float(eval(expression, {"__builtins__": None}, {}))
        except Exception:
            continue
        if abs(value) < 1e6:
            return str(int(value)) if value.is_integer() else str(value)
    return rng.randint(1, 100)


def test_agrees_with_the_reference_on_random_completions():
    rng = random.Random(20260611)
    counts = {"answer": 0, "partial_format": 0, "full_format": 0, "non_integer_target": 0}
    for _ in range(20_000):
        numbers = [rng.randint(1, 99) for _ in range(rng.choice((2, 3, 4)))]
        target = reachable_target(rng, numbers)
        completion = random_completion(rng, numbers)
        scores = assert_agrees(completion, numbers, target)
        counts["answer"] += scores["answer_reward"] == 1.0
        counts["partial_format"] += scores["format_reward"] in (0.5, 0.6)
        counts["full_format"] += scores["format_reward"] == 1.0
        counts["non_integer_target"] += scores["answer_reward"] == 1.0 and "." in str(target)
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


@pytest.mark.parametrize(("completion", "target"), CRAFTED)
def test_agrees_with_the_reference_on_crafted_completions(completion, target):
    assert_agrees(completion, NUMBERS, target)


def test_the_reference_example_scores_as_the_reference_says():
    completion = " 44 + 19 = 63, 63 + 35 = 98</think>\n<answer>(44 + 19) + 35</answer>"
    assert compute_score(completion, numbers=NUMBERS, target="98") == {
        "reward": 1.1,
        "format_reward": 1.0,
        "answer_reward": 1.0,
    }
    partial = compute_score("<answer>(44 + 19) + 35</answer>", numbers=NUMBERS, target="98")
    assert partial == {"reward": 0.1 * 0.5 + 1.0, "format_reward": 0.5, "answer_reward": 1.0}


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
    numbers = [2, 99, 3, 2, 99, 3]
    completion = "x</think>\n<answer>2 ** 99 ** 3 // (2 ** 99 ** 3)</answer>"
    assert assert_agrees(completion, numbers, "1")["answer_reward"] == 1.0


def test_a_digit_run_longer_than_int_reads_scores_zero():
    """The reference raises here (int() of over 4300 digits, outside its try)."""
    completion = f"x</think>\n<answer>{'9' * 5000} + 1</answer>"
    assert compute_score(completion, numbers=[1, 2], target=3)["answer_reward"] == 0.0


def test_the_format_prefix_is_a_per_row_argument():
    """A dataset whose prompts do not end in <think> gives "" (or its own prefix)."""
    completion = "x</think>\n<answer>44+19+35</answer>"
    assert compute_score(completion, numbers=NUMBERS, target=98)["format_reward"] == 1.0
    scores = compute_score(completion, numbers=NUMBERS, target=98, format_prefix="")
    assert scores == {"reward": 0.1 * 0.5 + 1.0, "format_reward": 0.5, "answer_reward": 1.0}


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
