"""Noise-std and learning-rate schedules as pure functions of the step.

Implements the schedulers of nlp-waseda/lbes (`src/schedulers.py`): with progress
p = step / total_steps,

    constant     v0
    linear       v0 + (vf - v0) * p
    cosine       vf + (v0 - vf) * (1 + cos(pi * p)) / 2
    exponential  v0 * rate**step              (ignores vf and total_steps, as the reference)
    polynomial   vf + (v0 - vf) * (1 - p)**power

linear, cosine and polynomial hold vf once step >= total_steps, as the reference does. The
reference fixes rate at 0.95 and power at 1.0; here both are settings
(`noise_std_scheduler_rate`, `noise_std_scheduler_power`, `lr_scheduler_rate`,
`lr_scheduler_power`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

# (initial, final, step, total_steps, rate, power) -> value
Schedule = Callable[[float, float, int, int, float, float], float]


def constant(
    initial: float, final: float, step: int, total_steps: int, rate: float, power: float
) -> float:
    return initial


def linear(
    initial: float, final: float, step: int, total_steps: int, rate: float, power: float
) -> float:
    if step >= total_steps:
        return final
    return initial + (final - initial) * (step / total_steps)


def cosine(
    initial: float, final: float, step: int, total_steps: int, rate: float, power: float
) -> float:
    if step >= total_steps:
        return final
    decay = 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
    return final + (initial - final) * decay


def exponential(
    initial: float, final: float, step: int, total_steps: int, rate: float, power: float
) -> float:
    # The reference never reaches `final` here: it decays geometrically forever.
    return initial * rate**step


def polynomial(
    initial: float, final: float, step: int, total_steps: int, rate: float, power: float
) -> float:
    if step >= total_steps:
        return final
    return final + (initial - final) * (1.0 - step / total_steps) ** power


SCHEDULES: dict[str, Schedule] = {
    "constant": constant,
    "linear": linear,
    "cosine": cosine,
    "exponential": exponential,
    "polynomial": polynomial,
}


def schedule_value(
    kind: str,
    initial: float,
    final: float,
    step: int,
    total_steps: int,
    rate: float = 0.95,
    power: float = 1.0,
) -> float:
    """The value of schedule `kind` at `step` (0-based: step 0 gives `initial`)."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}: choose one of {', '.join(SCHEDULES)}")
    if step < 0 or total_steps < 0:
        raise ValueError(f"step and total_steps must be >= 0, got {step} and {total_steps}")
    return float(SCHEDULES[kind](initial, final, step, total_steps, rate, power))


def planned_schedule(
    kind: str,
    initial: float,
    final: float,
    total_steps: int,
    rate: float = 0.95,
    power: float = 1.0,
) -> list[float]:
    """The value of every step, in order (the dashboard's plan): values[k] is
    schedule_value(k), what the (k + 1)-th update uses, recorded at step k + 1 as metrics
    number their steps (engine/trainer/loop.py, docs/metrics.md)."""
    return [
        schedule_value(kind, initial, final, step, total_steps, rate, power)
        for step in range(total_steps)
    ]
