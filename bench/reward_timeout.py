"""What `reward_timeout_seconds` costs: scoring one member's batch of countdown completions in
the trainer's process (no limit) and in the reward child process (the limit's default).

    .venv/bin/python bench/reward_timeout.py [--prompts 200] [--n 1] [--repeat 5]

Prints milliseconds per batch for each, and the child's start-up once.
"""

from __future__ import annotations

import argparse
import time

from engine.backends.base import Completion
from engine.scoring.batch import score_batch
from engine.scoring.reward_process import RewardLimit

PATH = "engine.rewards.countdown.compute_score"
TEXT = "<think>8 * 3 = 24, plus 1</think>\n<answer>(8 * 3) + 1</answer>"


def best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    a = parser.parse_args()
    outputs = [[Completion(TEXT, 40, True)] * a.n for _ in range(a.prompts)]
    args = [{"target": 25, "numbers": [8, 3, 1]}] * a.prompts

    def run(limit: RewardLimit | None) -> None:
        score_batch(outputs, args, PATH, "bench", limit)

    start = time.perf_counter()
    run(RewardLimit(10.0))
    count = a.prompts * a.n
    rows = [
        ("child start-up and first batch", (time.perf_counter() - start) * 1000),
        (f"{count} completions, in process", best_ms(lambda: run(None), a.repeat)),
        (f"{count} completions, child process", best_ms(lambda: run(RewardLimit(10.0)), a.repeat)),
    ]
    for label, ms in rows:
        print(f"{label:<40} {ms:8.1f} ms")


if __name__ == "__main__":
    main()
