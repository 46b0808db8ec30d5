"""The ES update as small pure helpers: who the population is, and what each seed adds.

The update follows the nlp-waseda/lbes convention (`src/worker_extension.py`, `update`;
docs/design.md, "Engine rules"):

    theta += lr / (N * sigma) * sum_i A_i * eps_i

with A_i the shaped fitness of member i, N the population size and eps_i the Gaussian noise
regenerated from member i's seed. Members whose coefficient is 0 (A_i is 0 or NaN) are
skipped, as the reference skips them. With antithetic (mirrored) sampling, members 2k and
2k+1 share one seed with signs +1 and -1, so eps_{2k+1} = -eps_{2k}; the sign is folded into
the coefficient, and the two terms of a pair merge into one noise regeneration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.noise import member_seed


@dataclass(frozen=True)
class Member:
    """One population member: its perturbation is sign * sigma * eps(seed)."""

    index: int
    seed: int
    sign: int  # +1 or -1


def population(run_seed: int, step: int, size: int, antithetic: bool) -> list[Member]:
    """The `size` members of training step `step`; seeds depend only on (run_seed, step, k)."""
    if size < 1:
        raise ValueError(f"population size must be >= 1, got {size}")
    if not antithetic:
        return [Member(i, member_seed(run_seed, step, i), +1) for i in range(size)]
    if size % 2:
        raise ValueError(f"antithetic sampling needs an even population size, got {size}")
    members = []
    for k in range(size // 2):
        seed = member_seed(run_seed, step, k)
        members += [Member(2 * k, seed, +1), Member(2 * k + 1, seed, -1)]
    return members


def update_coefficients(
    shaped: np.ndarray, signs: Sequence[int], learning_rate: float, noise_std: float
) -> np.ndarray:
    """Per-member coefficients c_i = lr / (N * sigma) * A_i * sign_i; NaN advantages give 0."""
    shaped = np.asarray(shaped, dtype=np.float64)  # [N]
    signs_arr = np.asarray(signs, dtype=np.float64)  # [N]
    if shaped.shape != signs_arr.shape:
        raise ValueError(f"{shaped.shape[0]} advantages for {signs_arr.shape[0]} signs")
    if noise_std <= 0:
        raise ValueError(f"noise_std must be > 0, got {noise_std}")
    scale = learning_rate / (shaped.size * noise_std)
    return np.where(np.isnan(shaped), 0.0, scale * shaped * signs_arr)


def update_terms(members: Sequence[Member], coefficients: np.ndarray) -> list[tuple[int, float]]:
    """(seed, coefficient) pairs to apply: members sharing a seed merged, zero terms dropped.

    Antithetic pairs become one term (c_{2k} + c_{2k+1}), halving noise regenerations in the
    update. Order is the members' order, so every engine applies the same sequence.
    """
    if len(members) != len(coefficients):
        raise ValueError(f"{len(coefficients)} coefficients for {len(members)} members")
    merged: dict[int, float] = {}
    for member, coefficient in zip(members, coefficients, strict=True):
        merged[member.seed] = merged.get(member.seed, 0.0) + float(coefficient)
    return [(seed, c) for seed, c in merged.items() if c != 0.0]
