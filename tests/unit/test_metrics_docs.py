"""docs/metrics.md's table and engine/metrics.py name the same keys: a key added to one and
not the other fails here."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from engine import metrics as mk

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def expand(key: str) -> list[str]:
    """`a/{b,c}_d` -> [`a/b_d`, `a/c_d`]."""
    parts = re.split(r"\{([^}]*)\}", key)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def documented_keys() -> set[str]:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    cells = [row.split(" | ")[0] for row in rows]
    return {k for cell in cells for key in re.findall(r"`([^`]+)`", cell) for k in expand(key)}


def test_every_defined_key_is_documented():
    assert mk.fixed_keys() - documented_keys() == set()


def test_every_documented_key_is_defined_or_a_reward_part():
    unknown = {
        k
        for k in documented_keys() - mk.fixed_keys()
        if "<" not in k and not mk.REWARD_PART_KEY.fullmatch(k)
    }
    assert unknown == set()
    # the stat-less placeholders name keys reward_key builds
    assert all(
        mk.REWARD_PART_KEY.fullmatch(k.replace("<", "").replace(">", ""))
        for k in documented_keys()
        if "<" in k
    )


def test_known_keys_are_the_fixed_ones_and_reward_parts_by_shape():
    assert mk.is_known_key(mk.reward_key(mk.EVAL)) and mk.is_known_key(mk.time_key("step"))
    assert mk.is_known_key("eval/accuracy/mean")  # a part a reward function names
    assert mk.is_known_key("train/member/scorer/mean")  # an ensemble member
    assert not mk.is_known_key("eval/reward/maen") and not mk.is_known_key("reward")
    assert not mk.is_known_key("eval/reward/mean\n")
    assert mk.close_key("eval/reward/maen") == "eval/reward/mean"
    assert mk.close_key("loss") is None
