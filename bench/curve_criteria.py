"""Whether a run learned and kept what it learned, judged from its eval curve: the criteria
the presets tuned by sweeps are held to (docs/sweeps.md, "Tuning the presets").

From the eval reward before training (step 0), after the run's last step, at its best eval
(the highest value of the curve, both ends included) and the task's optimum (the best reward
there is: 0 for conciseness, which is minus the characters off the target length):

- closer by = (after - before) / (optimum - before), the share of the distance to the optimum
  that training covered. The run learned when it is >= 0.40. It is undefined, and the run
  fails, when the model already scored the optimum before training.
- drop = (best - after) / |best|, how far the last eval fell below the best one. The run did
  not collapse when best - after <= 0.15 * |best| (a best of exactly 0 allows no drop).

Plain Python (no project imports), so that it is tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CLOSER_BY = 0.40
"""The least share of the way to the optimum a run must cover."""
MAX_DROP = 0.15
"""The most the last eval may fall below the run's best, as a share of |best|."""


@dataclass(frozen=True)
class Verdict:
    before: float
    best: float
    best_step: int
    after: float
    closer_by: float | None  # None: the model scored the optimum before training
    drop: float | None  # None: best is 0 and after is below it (an infinite share)

    @property
    def learned(self) -> bool:
        return self.closer_by is not None and self.closer_by >= CLOSER_BY

    @property
    def kept(self) -> bool:
        """No collapse: the last eval within MAX_DROP of the best."""
        return self.best - self.after <= MAX_DROP * abs(self.best)

    @property
    def passed(self) -> bool:
        return self.learned and self.kept


def judge(curve: Mapping[int, float], optimum: float) -> Verdict:
    """The verdict on an eval curve {step: reward} that holds step 0 and at least one step
    after it; ValueError otherwise, or when a reward lies beyond the optimum (a wrong one)."""
    if 0 not in curve or len(curve) < 2:
        raise ValueError(
            f"an eval curve needs step 0 (eval_before_train) and a later eval, got steps "
            f"{sorted(curve)}"
        )
    if (above := max(curve.values())) > optimum:
        raise ValueError(f"eval reward {above} lies beyond the optimum {optimum}")
    before, after = curve[0], curve[max(curve)]
    best_step = max(sorted(curve), key=lambda step: curve[step])  # the first of equal bests
    best = curve[best_step]
    closer_by = None if before == optimum else (after - before) / (optimum - before)
    # a best of 0 leaves no room: any drop is an infinite share of it
    drop = (best - after) / abs(best) if best != 0 else (0.0 if after == best else None)
    return Verdict(before, best, best_step, after, closer_by, drop)
