"""docs/metrics.md's table and engine/metrics.py name the same keys: a key added to one and
not the other fails here."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from engine import metrics as mk

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# a key reward_key builds for a part a reward function or the aligner names
REWARD_KEY = re.compile(rf"^(train|eval)/[^/]+(/[^/]+)?/({'|'.join(mk.STATS)})$")


def expand(key: str) -> list[str]:
    """`a/{b,c}_d` -> [`a/b_d`, `a/c_d`]."""
    parts = re.split(r"\{([^}]*)\}", key)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def documented_keys() -> set[str]:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    cells = [row.split(" | ")[0] for row in rows]
    return {k for cell in cells for key in re.findall(r"`([^`]+)`", cell) for k in expand(key)}


def defined_keys() -> set[str]:
    """Every fixed key engine/metrics.py defines or builds from its own names."""
    constants = {v for k, v in vars(mk).items() if k.isupper() and isinstance(v, str) and "/" in v}
    return (
        constants
        | {mk.time_key(p) for p in mk.PHASES}
        | {mk.completion_key(s, c) for s in (mk.TRAIN, mk.EVAL) for c in mk.COMPLETION_STATS}
        | {mk.reward_key(s, "reward", stat) for s in (mk.TRAIN, mk.EVAL) for stat in mk.STATS}
        | {mk.reward_key(mk.TRAIN, mk.POPULATION_REWARD, s) for s in ("std", "min", "max")}
    )


def test_every_defined_key_is_documented():
    assert defined_keys() - documented_keys() == set()


def test_every_documented_key_is_defined_or_a_reward_part():
    unknown = {
        k for k in documented_keys() - defined_keys() if "<" not in k and not REWARD_KEY.match(k)
    }
    assert unknown == set()
    # the stat-less placeholders name keys reward_key builds
    assert all(
        REWARD_KEY.match(k.replace("<", "").replace(">", "")) for k in documented_keys() if "<" in k
    )
