"""Which prompts each step trains on.

Every epoch visits the training set in a fresh order drawn from (run seed, epoch), so the
order depends on nothing but the seed and the position (epoch, batch): a resumed run sees
exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.noise import derive_seed


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    batch: int = 0


class Batches:
    def __init__(self, num_examples: int, batch_size: int, seed: int) -> None:
        if num_examples < 1:
            raise ValueError("the training set is empty")
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        # The last batch of an epoch may be short (no examples are dropped).
        self.per_epoch = math.ceil(num_examples / batch_size)

    def indices(self, position: Position) -> list[int]:
        order = np.random.default_rng(derive_seed(self.seed, "epoch", position.epoch))
        permutation = order.permutation(self.num_examples)
        start = position.batch * self.batch_size
        return permutation[start : start + self.batch_size].tolist()

    def drawn(self, position: Position) -> int:
        """Batches drawn before `position`: the loop's count of steps, skipped ones included."""
        return position.epoch * self.per_epoch + position.batch

    def advance(self, position: Position) -> tuple[Position, bool]:
        """The next position, and whether this step ended an epoch."""
        if position.batch + 1 < self.per_epoch:
            return Position(position.epoch, position.batch + 1), False
        return Position(position.epoch + 1, 0), True
