"""GSM8K reward: the final integer answer inside <answer></answer>.

Semantics of nlp-waseda/lbes `src/reward_funcs/gsm8k.py`: the completion must start with a
non-empty `<think>` block, hold exactly one each of the four tags, and the answer must be an
integer, optionally negative and with thousands commas. Commas are ignored when comparing
with `ground_truth`, as strings (so "1,000" matches "1000", and "42.0" does not match "42").

reward = format + accuracy: 1.1 correct, 0.1 well formatted but wrong, 0 otherwise; `format`
is 0.1 for a well-formatted answer, the reference's scale, so `train/format/mean` compares with
the reference's chart as it is.
"""

from __future__ import annotations

import re

from engine import metrics as mk

FORMAT_REWARD = 0.1  # the reference's `format` part of a well-formatted answer

_COMPLETION = re.compile(r"^<think>.+</think>.*<answer>(-?[\d,]*\d)</answer>.*$", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def extract_answer(completion_text: str) -> str | None:
    """The integer text inside <answer></answer>, or None when the format is wrong."""
    if any(completion_text.count(tag) != 1 for tag in _TAGS):
        return None
    match = _COMPLETION.match(completion_text)
    return match.group(1) if match else None


def compute_score(completion_text: str, *, ground_truth: str | int) -> dict:
    """Score one completion: {"reward": format + accuracy, "format": 0|0.1,
    "accuracy": 0|1}."""
    answer = extract_answer(completion_text)
    format_part = 0.0 if answer is None else FORMAT_REWARD
    is_correct = answer is not None and answer.replace(",", "") == str(ground_truth).replace(
        ",", ""
    )
    accuracy = 1.0 if is_correct else 0.0
    return {
        "reward": format_part + accuracy,
        "format": format_part,
        mk.ACCURACY: accuracy,
    }
