"""Countdown as ES at Scale grades it (VsonicV/es-at-scale,
`es_at_scale/reward_function/countdown_grader.py`, the same rules as the older
`archive/countdown/countdown_task.py`); the LBES countdown is engine/rewards/countdown.py.

- `format_reward`, on `format_prefix + completion`: 1.0 when the whole text is
  `<think>...</think>\\n<answer>...</answer>`; otherwise 0.1 if it holds a think block plus
  0.5 if it holds an answer block (0, 0.1, 0.5 or 0.6). The reference's prompt ends in
  "<think>", which the model does not repeat, so the reference prepends "<think>" before this
  check; that is the default `format_prefix`, and a dataset whose prompts end otherwise sets
  it per row in reward_func_args (for example "").
- `answer_reward`, on the completion alone: 1.0 when the last `<answer>...</answer>` holds
  only digits, `+ - * / ( )` and spaces, its digit runs are the given numbers as a multiset,
  and its value as Python computes it is within 1e-5 of the target; else 0.0. The target may
  be a non-integer ("27.4") and is given as a number or as the reference's string.
- reward = 0.1 * format_reward + answer_reward (at most 1.1).
- `accuracy` (engine.metrics.ACCURACY) = 1.0 when answer_reward > 0, else 0.0: the reference's
  evaluation scripts (`archive/eval_countdown.py`, `archive/eval_countdown_vllm.py`) count a
  puzzle as solved so, and its paper's Table 1 reports that share; here it is a reward part,
  so every evaluation reports it as `eval/accuracy/mean`.

The reference computes the value with `eval`; here the expression is parsed and computed
node by node with Python's own operators, so every value, rounding and error (a division by
zero, an overflow, a complex power) is the one `eval` gives, and the result agrees with the
reference's (tests/unit/test_countdown_es_at_scale.py compares them on random and crafted
completions). Two differences, both where the reference cannot finish: a power whose result
would exceed MAX_POWER_BITS bits scores 0 (the reference computes it for as long as it takes;
its trainer's reward timeout then scores 0), and a digit run too long for `int` scores 0 (the
reference raises, outside its error handling).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

from engine import metrics as mk

FORMAT_WEIGHT = 0.1
TOLERANCE = 1e-5
THINK_PREFIX = "<think>"
# A power with a result over a million bits is refused rather than computed: it takes Python
# longer than a reward may take, and no countdown target needs one.
MAX_POWER_BITS = 1_000_000
# How deeply an answer's expressions may nest: what the reference's `eval` builds under
# Python's default recursion limit (1000) from a shallow stack, 2,987 (so 900 signs in a row
# compute and 5,000 score 0, as in the reference). `ast.parse` alone would follow the
# process's recursion limit, which an imported library may have raised.
MAX_DEPTH = 2_987

# What the grader accepts, the reference's language (checked equal on 20,000 fuzzed
# completions): a think block, an answer block (shortest matches, across lines), the whole
# completion as exactly a think block, a newline and an answer block, and an answer of digits,
# the four operators, parentheses and spaces only.
_THINK = re.compile("<think>.*?</think>", re.DOTALL)
_ANSWER = re.compile("<answer>.*?</answer>", re.DOTALL)
_FULL_FORMAT = re.compile("^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
_ANSWER_CONTENT = re.compile("<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED = re.compile("^[-+*/()0-9 ]+$")
_DIGIT_RUN = re.compile("[0-9]+")

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class _NoValue(Exception):
    """The expression has no value the reference could compare (it would raise)."""


def format_reward(text: str) -> float:
    """1.0, or the partial credit 0.1 (think block) + 0.5 (answer block)."""
    if _FULL_FORMAT.match(text):
        return 1.0
    reward = 0.0
    if _THINK.search(text):
        reward += 0.1
    if _ANSWER.search(text):
        reward += 0.5
    return reward


def answer_reward(completion_text: str, numbers: list[int], target: float) -> float:
    """1.0 when the last answer block reaches `target` with exactly `numbers`, else 0.0."""
    answers = _ANSWER_CONTENT.findall(completion_text)
    if not answers:
        return 0.0
    expression = answers[-1].strip()
    if not expression or not _ALLOWED.match(expression):
        return 0.0
    try:
        used = sorted(int(run) for run in _DIGIT_RUN.findall(expression))
    except ValueError:  # a digit run over Python's int-from-text limit
        return 0.0
    if used != sorted(numbers):
        return 0.0
    try:
        return 1.0 if abs(float(evaluate(expression)) - float(target)) < TOLERANCE else 0.0
    except (_NoValue, ArithmeticError, TypeError, ValueError):
        return 0.0


def evaluate(expression: str) -> Any:
    """The value Python's `eval` gives `expression` (digits, + - * / ( ) and spaces), which
    may be an int, a float or a complex; raises _NoValue, ArithmeticError or TypeError where
    `eval` would raise (or a power is over MAX_POWER_BITS)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _NoValue(str(exc)) from None
    if _depth(tree.body) > MAX_DEPTH:
        raise _NoValue("too deeply nested")
    try:
        return _value(tree.body)
    except RecursionError as exc:
        raise _NoValue("too deeply nested") from exc


def _depth(root: ast.expr) -> int:
    """How deeply expressions nest below and including `root` (iteratively: it may be
    deeper than the recursion limit)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    return deepest


def _value(node: ast.expr) -> Any:
    # A chain of signs ("- - 3") is unrolled rather than recursed into: it may be longer than
    # Python's recursion limit, which `eval` still computes.
    signs: list[Callable[[Any], Any]] = []
    while isinstance(node, ast.UnaryOp):
        sign = _UNARY.get(type(node.op))
        if sign is None:
            raise _NoValue(f"operator {type(node.op).__name__}")
        signs.append(sign)
        node = node.operand
    value = _plain_value(node)
    for sign in reversed(signs):
        value = sign(value)
    return value


def _plain_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _BINARY[type(node.op)](left, right)
    # What else these characters parse to, "()" (a tuple) and "(2)(3)" (a call), makes
    # `eval` raise or return a value that is not a number: the reference scores 0.
    raise _NoValue(f"{type(node).__name__} is not arithmetic")


def _check_power(base: Any, exponent: Any) -> None:
    if type(base) is not int or type(exponent) is not int or exponent <= 0 or abs(base) <= 1:
        return  # a float or complex power is one floating-point operation
    if exponent * (abs(base).bit_length() - 1) > MAX_POWER_BITS:
        raise _NoValue(f"a power of more than {MAX_POWER_BITS} bits")


def as_target(value: Any) -> float | int:
    """A target as the reference reads it: a number, or its text ("98", "27.4", whose integral
    values become ints). Refuses what is not a finite number, which no answer could reach."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"target must be a number or its text, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise ValueError(f"target must be a number or its text, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"target must be a finite number, got {value!r}")
    return int(number) if isinstance(value, str) and number.is_integer() else number


def as_numbers(numbers: Iterable[Any]) -> list[int]:
    numbers = list(numbers)
    if any(type(n) is not int for n in numbers):
        raise ValueError(f"numbers must be whole numbers, got {numbers!r}")
    return numbers


def compute_score(
    completion_text: str,
    *,
    numbers: Iterable[int],
    target: int | float | str,
    format_prefix: str = THINK_PREFIX,
) -> dict[str, float]:
    """{"reward": 0.1 * format_reward + answer_reward, "format_reward", "answer_reward",
    "accuracy"}; the first part names are the reference's, whose format_reward is on a 0-1
    scale, and accuracy is answer_reward > 0 as 0 or 1."""
    given = as_numbers(numbers)
    goal = as_target(target)
    format_part = format_reward(format_prefix + completion_text)
    answer_part = answer_reward(completion_text, given, goal)
    return {
        "reward": FORMAT_WEIGHT * format_part + answer_part,
        "format_reward": format_part,
        "answer_reward": answer_part,
        mk.ACCURACY: 1.0 if answer_part > 0 else 0.0,
    }
