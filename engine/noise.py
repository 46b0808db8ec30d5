"""Seeds for ES perturbations.

One seed gives one perturbation, the same on every engine and every time (DESIGN.md, engine
rules). Seeds are derived by hashing, as nlp-waseda/lbes does (`derive_seed`), so a member's
seed depends only on (run seed, step, member) and never on the order engines ran in.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 31


def derive_seed(base: int, *parts: int | str) -> int:
    """Hash `base` and `parts` into a non-negative 31-bit seed (the lbes `derive_seed` rule)."""
    key = "_".join(str(p) for p in (base, *parts))
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**SEED_BITS)


def member_seed(run_seed: int, step: int, member: int) -> int:
    """The seed of population member `member` at training step `step`."""
    return derive_seed(run_seed, step, member)
