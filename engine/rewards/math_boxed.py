"""Math answers in `\\boxed{}`, graded as ES at Scale grades its math task (VsonicV/es-at-scale,
`es_at_scale/reward_function/math_grader.py`, `boxed_reward_fn`, which its `train.py --task
math` passes to the trainer; the lineage is the MATH dataset's normaliser, PRM800K's sympy
grader and Hugging Face's math-verify).

- The answer is the content of the last `\\boxed{...}` of the completion, braces balanced; a
  completion without one, or whose last `\\boxed` is not followed at once by `{` or is never
  closed, is unformatted: reward 0, `formatted` 0.
- It is correct (reward 1) when any of three checks says so, in this order, against
  `ground_truth` (a string, a number, or a list of accepted answers; a truth written as
  `\\boxed{...}` is unwrapped first):
  1. the two are equal after the MATH dataset's normalisation (`\\dfrac` is `\\frac`, units,
     `\\left`, spaces, dollar and percent signs and a short `x =` are dropped, `0.5` is 1/2);
  2. they are equal after PRM800K's normalisation (LaTeX read as text, lower case, thousands
     commas and braces dropped), or element by element under sympy, where an integer truth
     needs an integer answer and two fractions must be written alike (2/4 is not 1/2 here);
  3. unless `fast`, math-verify finds them equivalent (so 2/4, 10^3 for 1000, 0.1 for 10%
     and a reordered set count), skipped for a long, repetitive answer.
  Otherwise reward 0, `formatted` 1: no credit for the format, as in the reference.
- `accuracy` (engine.metrics.ACCURACY) is the reward itself, so an evaluation's
  `eval/accuracy/mean` is the reference's pass@1.

The reference's trainer grades with `fast` off, as the default here. This is ES Lab's own
implementation, compared with the reference's function on curated completions by
tests/unit/test_math_boxed.py; its unit list is shorter than the reference's (which drops,
among others, one-letter words such as "a" or "t" from an answer), so an answer that differs
from the truth only by such a word may grade otherwise. The reference bounds each math-verify
call to 1 s with SIGALRM; here that holds when grading runs in the main thread (the reward
process), and elsewhere the run's reward_timeout_seconds is the bound.

Checks 2 and 3 need the `math` extra (pylatexenc, math-verify): `pip install 'eslab[math]'`.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

import sympy
from sympy.parsing import sympy_parser

from engine import metrics as mk

BOX = "\\boxed"
LONG_ANSWER_CHARS = 128  # longer answers are checked for repetition before math-verify
MAX_REPEAT_SHARE = 0.2  # share of repeated suffix prefixes above which math-verify is skipped
VERIFY_SECONDS = 1  # the reference's bound on each math-verify parse and comparison

# Words dropped from an answer as units by the MATH normalisation (ES Lab's own list).
_UNITS = (
    "degree",
    "degrees",
    "cm",
    "mm",
    "km",
    "m",
    "kg",
    "g",
    "lb",
    "lbs",
    "ft",
    "feet",
    "inch",
    "inches",
    "yard",
    "yards",
    "mile",
    "miles",
    "mph",
    "hour",
    "hours",
    "minute",
    "minutes",
    "second",
    "seconds",
    "day",
    "days",
    "year",
    "years",
    "meter",
    "meters",
    "metre",
    "metres",
    "unit",
    "units",
    "way",
    "ways",
    "percent",
)
# Unit words (with plural and power) dropped by the PRM800K normalisation.
_SYMPY_UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_TEXT_ONLY = re.compile(r"^\\text\{(?P<inner>.+?)\}$")
_BRACKETS = "()[]"


def boxed_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, or None when there is none (or it is
    not followed by `{`, or never closed)."""
    start = text.rfind(BOX)
    if start < 0:
        return None
    open_at = start + len(BOX)
    if not text.startswith("{", open_at):
        return None
    depth = 0
    for at in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[open_at + 1 : at]
    return None


# -- check 1: the MATH dataset's normalisation --------------------------------------------


def _braced_fracs(text: str) -> str:
    """`\\frac12` and `\\frac1{2}` as `\\frac{1}{2}`; a form too short to read stays as it is."""
    head, *tails = text.split("\\frac")
    out = [head]
    for tail in tails:
        if tail[0] == "{":  # an empty tail (a trailing \\frac) is unreadable: IndexError
            out.append("\\frac" + tail)
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            out.append("\\frac{" + tail[0] + "}" + tail[1:])
        else:
            out.append("\\frac{" + tail[0] + "}{" + tail[1] + "}" + tail[2:])
    return "".join(out)


def _braced_sqrts(text: str) -> str:
    """`\\sqrt3` as `\\sqrt{3}`."""
    head, *tails = text.split("\\sqrt")
    return head + "".join(
        "\\sqrt" + (tail if tail.startswith("{") else "{" + tail[0] + "}" + tail[1:])
        for tail in tails
    )


def _slash_as_frac(text: str) -> str:
    """`3/4` (two plain integers) as `\\frac{3}{4}`."""
    match = re.fullmatch(r"(-?\d+)/(-?\d+)", text)
    if match is None or text != f"{int(match[1])}/{int(match[2])}":
        return text
    return "\\frac{" + str(int(match[1])) + "}{" + str(int(match[2])) + "}"


def _plain_latex(text: str) -> str:
    """Layout dropped: line breaks, `\\!`, `\\left`/`\\right`; one spelling each for
    fractions, matrices and relations; a trailing `\\text{...}` (a unit) and unit words."""
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = text.replace("\\end{array}", "\\end{pmatrix}").replace("bmatrix", "pmatrix")
    for old, new in (("tfrac", "frac"), ("dfrac", "frac"), ("\\neq", "\\ne"), ("\\leq", "\\le")):
        text = text.replace(old, new)
    text = text.replace("\\geq", "\\ge").replace("\\left", "").replace("\\right", "")
    without_text_tail = re.sub(r"\\text{.*?}$", "", text).strip()
    if without_text_tail:
        text = without_text_tail
    for _ in range(2):
        for unit in _UNITS:
            dropped = re.sub(r"(^|\W)" + unit + r"($|\W)", r"\1\2", text)
            if dropped:
                text = dropped
    return text


def _math_dataset_form(answer: str) -> str:
    """The MATH dataset's normal form of an answer; raises ValueError or IndexError on an
    answer it cannot read (the caller then compares the answer as written)."""
    text = _plain_latex(answer)
    for mark in ("^{\\circ}", "^\\circ", "\\$"):
        text = text.replace(mark, "")
    if "\\text{ " in text:
        head, *rest = text.split("\\text{ ")
        if len(rest) != 1:
            raise ValueError("more than one unit")
        text = head
    text = text.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text.startswith("."):
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _braced_sqrts(text).replace(" ", "")
    text = _braced_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_as_frac(text)


def math_dataset_form(answer: str) -> str:
    """The MATH dataset's normal form, or the stripped answer where it cannot be read."""
    answer = answer.strip()
    match = _TEXT_ONLY.search(answer)
    inner = match["inner"].strip() if match else answer
    try:
        return _math_dataset_form(inner)
    except (ValueError, IndexError):
        return inner


# -- check 2: PRM800K's normalisation and sympy --------------------------------------------


@cache
def _latex_reader() -> Any:
    try:
        from pylatexenc.latex2text import LatexNodes2Text
    except ImportError as error:
        raise ImportError(
            "engine.rewards.math_boxed needs pylatexenc: pip install 'eslab[math]'"
        ) from error
    return LatexNodes2Text()


def _latex_as_text(expr: str) -> str:
    for old, new in (("\\tfrac", "\\frac"), ("\\dfrac", "\\frac"), ("\\frac", " \\frac")):
        expr = expr.replace(old, new)
    expr = _latex_reader().latex_to_text(expr)
    for old, new in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*")):
        expr = expr.replace(old, new)
    return expr.replace("×", "*").strip()


def _without_thousands_commas(expr: str) -> str:
    pattern = re.compile(r"(\d),(\d\d\d)($|\D)")
    while (next_expr := pattern.sub(r"\1\2\3", expr)) != expr:
        expr = next_expr
    return expr


def _as_integer(expr: str) -> int | None:
    """The integer an expression writes (thousands commas allowed), or None."""
    try:
        value = float(_without_thousands_commas(expr))
        return int(value) if abs(value - round(value)) <= 1e-7 else None
    except (ValueError, OverflowError):
        return None


def sympy_form(expr: str) -> str:
    """PRM800K's normal form of an answer."""
    match = _TEXT_ONLY.search(expr)
    if match is not None:
        expr = match["inner"]
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", "")):
        expr = expr.replace(old, new)
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in (("million", 6), ("billion", 9), ("trillion", 12)):
        expr = expr.replace(word, f"*10^{power}")
    for unit in _SYMPY_UNITS:
        expr = re.sub(unit + r"(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    try:
        number = float(expr)
        if abs(number - round(number)) <= 1e-7:
            expr = str(round(number))
    except (ValueError, OverflowError):
        pass
    if "\\" in expr:
        try:
            expr = _latex_as_text(expr)
        except ImportError:
            raise
        except Exception:  # an unreadable LaTeX answer is compared as written
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number, 7 3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    integer = _as_integer(expr)
    return str(integer) if integer is not None else expr


def _elements(expr: str) -> list[str]:
    """A tuple's or an interval's elements, or the expression itself."""
    expr = _without_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _BRACKETS
        and expr[-1] in _BRACKETS
        and not any(mark in inner for mark in _BRACKETS)
    ):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def _safe_for_sympy(expr: str) -> bool:
    """Refuse what sympy may hang on: three or more unknown letters, or large powers."""
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return re.search(r"\^[0-9]+\^|\^[0-9][0-9]+", expr) is None


def _equal_under_sympy(truth: str, given: str) -> bool:
    difference = f"({truth})-({given})"
    if not _safe_for_sympy(difference):
        return False
    transformations = (
        *sympy_parser.standard_transformations,
        sympy_parser.implicit_multiplication_application,
    )
    try:
        parsed = sympy_parser.parse_expr(
            difference.replace("^", "**"), transformations=transformations
        )
        return sympy.simplify(parsed) == 0
    except Exception:  # what sympy cannot read is not equal
        return False


def _is_fraction(expr: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr) is not None


def _elements_equal(truth: str, given: str) -> bool:
    if _is_fraction(truth) and _is_fraction(given):
        return truth == given  # an unreduced fraction is not the reduced one
    if (_as_integer(truth) is None) != (_as_integer(given) is None):
        return False  # an integer truth takes an integer answer, as written
    return _equal_under_sympy(truth, given)


def sympy_equal(given: str, truth: str) -> bool:
    """Check 2: PRM800K's comparison."""
    truth_form, given_form = sympy_form(truth), sympy_form(given)
    if truth_form == given_form:
        return True
    if not given_form:
        return False
    truth_parts, given_parts = _elements(truth_form), _elements(given_form)
    if len(truth_parts) > 1 and (
        truth_form[0] != given_form[0] or truth_form[-1] != given_form[-1]
    ):
        return False
    if len(truth_parts) != len(given_parts):
        return False
    return all(_elements_equal(t, g) for t, g in zip(truth_parts, given_parts, strict=True))


# -- check 3: math-verify ----------------------------------------------------------------


def is_repetitive(text: str) -> bool:
    """Whether the prefixes shared by neighbouring sorted suffixes (sum over the suffix array)
    exceed MAX_REPEAT_SHARE of all n(n+1)/2 prefixes: a looping answer."""
    n = len(text)
    if n <= 1:
        return False
    suffixes = sorted(range(n), key=lambda at: text[at:])
    shared = 0
    for left, right in itertools.pairwise(suffixes):
        length = 0
        while (
            right + length < n and left + length < n and text[left + length] == text[right + length]
        ):
            length += 1
        shared += length
    return shared * 2 / (n * (n + 1)) > MAX_REPEAT_SHARE


@cache
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as error:
        raise ImportError(
            "engine.rewards.math_boxed needs math-verify unless fast is set: "
            "pip install 'eslab[math]'"
        ) from error
    return math_verify


def verify_equal(given: str, truth: str) -> bool:
    """Check 3: math-verify's equivalence of the two answers, each read as LaTeX math."""
    if any(len(text) > LONG_ANSWER_CHARS and is_repetitive(text) for text in (given, truth)):
        return False
    mv = _math_verify()
    # math-verify bounds its calls with SIGALRM, which only the main thread may set.
    seconds = VERIFY_SECONDS if threading.current_thread() is threading.main_thread() else None
    config = (mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig())

    def read(text: str) -> list:
        text = text.replace("\n", "")
        return mv.parse(
            text if "$" in text else f"${text}$",
            extraction_config=config,
            fallback_mode="no_fallback",
            extraction_mode=["first_match"],
            parsing_timeout=seconds,
        )

    try:
        return bool(mv.verify(read(truth), read(given), timeout_seconds=seconds))
    except Exception:  # what math-verify cannot read is not equal
        return False


# -- the reward -----------------------------------------------------------------------------


def is_correct(answer: str, truth: str, *, fast: bool = False) -> bool:
    """Whether a boxed answer matches one accepted answer (checks 1-3 of the module)."""
    if BOX in truth:
        unwrapped = boxed_answer(truth)
        if unwrapped is None:
            return False
        truth = unwrapped
    if math_dataset_form(answer) == math_dataset_form(truth) or sympy_equal(answer, truth):
        return True
    return not fast and verify_equal(answer, truth)


def compute_score(
    completion_text: str,
    *,
    ground_truth: str | float | Sequence[str],
    fast: bool = False,
) -> dict:
    """Score one completion: {"reward": 0|1, "formatted": 0|1, "accuracy": 0|1}."""
    answer = boxed_answer(completion_text)
    if answer is None:
        return {"reward": 0.0, "formatted": 0.0, mk.ACCURACY: 0.0}
    truths = [ground_truth] if isinstance(ground_truth, str | int | float) else ground_truth
    correct = any(is_correct(answer, str(truth), fast=fast) for truth in truths)
    reward = 1.0 if correct else 0.0
    return {"reward": reward, "formatted": 1.0, mk.ACCURACY: reward}
