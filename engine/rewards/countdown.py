"""Countdown reward: reach the target with the given numbers, each used exactly once.

Semantics of nlp-waseda/lbes `src/reward_funcs/countdown.py`:

- The completion must hold exactly one each of `<think>`, `</think>`, `<answer>` and
  `</answer>`, in that order, with a non-empty think block.
- The answer must consist only of digits, `+ - * / ( )` and spaces, parse to an expression
  built only from binary `+ - * /`, unary `+ -` and integer literals, and its literals must be
  the given numbers as a multiset (each used exactly once, no others).
- It is evaluated exactly with `fractions.Fraction`, so `7 / 3 * 3` equals 7.

reward = format + accuracy, where `format` is 0.1 when the answer is a valid expression of
the given numbers and `accuracy` is 1 when it also equals the target: 1.1, 0.1 or 0. The parts
are on the reference's scale (its `format` is 0.1 too), so `train/format/mean` compares with
the reference's chart as it is.
A division by zero makes the expression invalid (reward 0), as in the reference. Unlike the
reference, `numbers` is required: without it the reference skips the multiset check and
accepts any expression that reaches the target.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

from engine import metrics as mk

FORMAT_REWARD = 0.1  # the reference's `format` part of a well-formed answer

# DOTALL: the think block spans lines. The tag counts are checked separately, because the
# regex alone would accept a second <answer> inside the think block.
_COMPLETION = re.compile(r"^.*<think>.+</think>.*<answer>(.+?)</answer>.*$", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]+")

_BINARY_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
_UNARY_OPS = (ast.UAdd, ast.USub)


def extract_answer(completion_text: str) -> str | None:
    """The stripped text inside <answer></answer>, or None when the tags are malformed."""
    if any(completion_text.count(tag) != 1 for tag in _TAGS):
        return None
    match = _COMPLETION.match(completion_text)
    return match.group(1).strip() if match else None


def _is_whitelisted(node: ast.AST) -> bool:
    match node:
        case ast.Expression(body=body):
            return _is_whitelisted(body)
        case ast.BinOp(left=left, op=op, right=right):
            return isinstance(op, _BINARY_OPS) and _is_whitelisted(left) and _is_whitelisted(right)
        case ast.UnaryOp(op=op, operand=operand):
            return isinstance(op, _UNARY_OPS) and _is_whitelisted(operand)
        case ast.Constant(value=value):
            # bool is an int subclass; the character filter already excludes True/False,
            # but the whitelist should not depend on it.
            return type(value) is int
        case _:
            return False


def _literals(node: ast.AST) -> list[int]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]


def _evaluate(node: ast.AST) -> Fraction:
    """Exact value of a whitelisted expression; raises ZeroDivisionError on x / 0."""
    match node:
        case ast.Expression(body=body):
            return _evaluate(body)
        case ast.Constant(value=value):
            return Fraction(value)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_evaluate(operand)
        case ast.UnaryOp(operand=operand):
            return _evaluate(operand)
        case ast.BinOp(left=left, op=ast.Add(), right=right):
            return _evaluate(left) + _evaluate(right)
        case ast.BinOp(left=left, op=ast.Sub(), right=right):
            return _evaluate(left) - _evaluate(right)
        case ast.BinOp(left=left, op=ast.Mult(), right=right):
            return _evaluate(left) * _evaluate(right)
        case ast.BinOp(left=left, right=right):
            return _evaluate(left) / _evaluate(right)
    raise ValueError(f"not a whitelisted expression node: {ast.dump(node)}")


def evaluate_expression(expression: str, numbers: Iterable[int]) -> Fraction | None:
    """The exact value of `expression` if it is a valid countdown answer for `numbers`
    (allowed characters, whitelisted syntax, literals = numbers as a multiset), else None."""
    if _ALLOWED_CHARS.fullmatch(expression) is None:
        return None
    try:
        tree = ast.parse(expression, mode="eval")
        # Deeply nested input can exhaust the recursion limit in the parser or in the walk
        # below; either way it is not an answer.
        if not _is_whitelisted(tree):
            return None
        if Counter(_literals(tree)) != Counter(int(n) for n in numbers):
            return None
        return _evaluate(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError, ZeroDivisionError):
        return None


def compute_score(completion_text: str, *, target: int, numbers: Iterable[int]) -> dict:
    """Score one completion: {"reward": format + accuracy, "format": 0|0.1,
    "accuracy": 0|1}."""
    expression = extract_answer(completion_text)
    value = None if expression is None else evaluate_expression(expression, numbers)
    is_valid = value is not None
    is_correct = is_valid and value == int(target)
    format_part = FORMAT_REWARD if is_valid else 0.0
    accuracy = 1.0 if is_correct else 0.0
    return {
        "reward": format_part + accuracy,
        "format": format_part,
        mk.ACCURACY: accuracy,
    }
