"""Cross-request batching for the scorer service.

Several vLLM engines score their members at once, each sending small requests; scoring them
one by one would run many tiny forward passes. The batcher's worker thread takes every
request that arrives within `max_wait_s` of the first, scores them together in micro-batches
of the models' batch size, and hands each request its own slice of the results.

A request waits at most `wait_timeout_s` for its answer (BatcherTimeout): a worker stuck on
one huge batch, or a queue longer than the models can get through, ends requests with a
clear error instead of holding their threads (FastAPI's pool is small) forever. A request
that gave up is skipped if it is still queued.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from scorer.models import ScoringModel


class BatcherTimeout(Exception):
    """A request waited longer than the batcher's `wait_timeout_s` for its scores."""


@dataclass
class _Job:
    prompts: list[str]
    responses: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    rewards: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    error: BaseException | None = None
    abandoned: bool = False


class RequestBatcher:
    """Merges concurrent score requests into shared forward passes (one worker thread)."""

    def __init__(
        self,
        reward: ScoringModel,
        cost: ScoringModel,
        max_wait_s: float = 0.01,
        max_items: int = 1024,
        wait_timeout_s: float = 120.0,
    ) -> None:
        self.reward, self.cost = reward, cost
        self.max_wait_s, self.max_items = max_wait_s, max_items
        self.wait_timeout_s = wait_timeout_s
        self.requests = 0  # requests scored
        self.rounds = 0  # merged rounds (fewer than requests when batching helped)
        self._queue: queue.Queue[_Job] = queue.Queue()
        threading.Thread(target=self._run, name="scorer-batcher", daemon=True).start()

    def score(self, prompts: list[str], responses: list[str]) -> tuple[list[float], list[float]]:
        job = _Job(prompts, responses)
        self._queue.put(job)
        if not job.done.wait(self.wait_timeout_s):
            job.abandoned = True
            raise BatcherTimeout(
                f"no scores within {self.wait_timeout_s:g} s: the scorer is busy with other "
                "requests or stuck on a batch"
            )
        if job.error is not None:
            raise job.error
        return job.rewards, job.costs

    def _collect(self) -> list[_Job]:
        jobs = [self._queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while sum(len(j.prompts) for j in jobs) < self.max_items:
            try:
                jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return [job for job in jobs if not job.abandoned]

    def _run(self) -> None:
        while True:
            jobs = self._collect()
            if not jobs:
                continue
            prompts = [p for j in jobs for p in j.prompts]
            responses = [r for j in jobs for r in j.responses]
            try:
                rewards = self.reward.score(prompts, responses)
                costs = self.cost.score(prompts, responses)
            except Exception as exc:  # every waiting request gets the error, not a hang
                for job in jobs:
                    job.error = exc
                    job.done.set()
                continue
            start = 0
            for job in jobs:
                end = start + len(job.prompts)
                job.rewards, job.costs = rewards[start:end], costs[start:end]
                start = end
                job.done.set()
            self.requests += len(jobs)
            self.rounds += 1
