"""What the unperturbed model takes for the very requests a step made: the denominators of the
benchmarks' efficiencies (bench/iteration.py, bench/lora.py).

A step's requests are recorded as they reach the engine (`Recorder`); the baseline replays
them on the unperturbed engine, each request held to its member's completion length
(ignore_eos, max_tokens = that length: perturbed members stop at other lengths than the base
model would), or, for log-likelihoods, as plain prefill of the same token ids. The same work,
minus everything ES adds, so an efficiency of baseline / step time cannot exceed 1 by more
than the noise of the timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.backends.vllm.engine import VLLMEngine


@dataclass
class Requests:
    """One engine call of a step: its prompts and each completion's length (generation), or
    its prompts and completion token ids (log-likelihoods)."""

    prompts: list[Any]
    lengths: list[int] = field(default_factory=list)
    completions: list[tuple[int, ...]] = field(default_factory=list)


class Recorder:
    """Records the generate and completion_logprobs calls made on one engine, per step:
    `start_step()` opens a new step's list."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.steps: list[dict[str, list[Requests]]] = []
        self._engine = engine
        generate, logprobs = engine.generate, engine.completion_logprobs

        def recording_generate(prompts: Any, *rest: Any, **options: Any) -> Any:
            outputs = generate(prompts, *rest, **options)
            # n samples of a prompt become n requests of it, in one call as the step made it
            picked = [(p, c.num_tokens) for p, cs in zip(prompts, outputs, strict=True) for c in cs]
            self._current("generate").append(
                Requests([p for p, _ in picked], [n for _, n in picked])
            )
            return outputs

        def recording_logprobs(prompts: Any, completions: Any) -> Any:
            self._current("logprobs").append(
                Requests(list(prompts), completions=[tuple(c) for c in completions])
            )
            return logprobs(prompts, completions)

        engine.generate = recording_generate  # type: ignore[method-assign]
        engine.completion_logprobs = recording_logprobs  # type: ignore[method-assign]

    def start_step(self) -> None:
        self.steps.append({"generate": [], "logprobs": []})

    def stop(self) -> None:
        del self._engine.generate, self._engine.completion_logprobs  # the methods again

    @contextmanager
    def paused(self) -> Iterator[VLLMEngine]:
        """The engine with its own methods meanwhile: a baseline's calls are not a step's."""
        generate, logprobs = self._engine.generate, self._engine.completion_logprobs
        self.stop()
        try:
            yield self._engine
        finally:
            self._engine.generate = generate  # type: ignore[method-assign]
            self._engine.completion_logprobs = logprobs  # type: ignore[method-assign]

    def _current(self, kind: str) -> list[Requests]:
        if not self.steps:
            self.start_step()
        return self.steps[-1][kind]


def timed_generate(
    engine: VLLMEngine, prompts: list[Any], params: list[Any], repeats: int
) -> tuple[float, list[int]]:
    """(median seconds, completion lengths) of `repeats` batched calls, after a warm-up, the
    prefix cache reset before each (a step's calls never find their prompts cached: every
    weight change resets it)."""
    requests = [{"prompt_token_ids": engine.prompt_token_ids(p)} for p in prompts]
    engine.llm.generate(requests[:4], params[:4], use_tqdm=False)
    seconds, lengths = [], []
    for _ in range(repeats):
        engine.llm.reset_prefix_cache()
        start_s = time.perf_counter()
        outputs = engine.llm.generate(requests, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start_s)
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
    return float(np.median(seconds)), lengths


def same_tokens_seconds(engine: VLLMEngine, call: Requests, repeats: int = 1) -> float:
    """Seconds the unperturbed model takes, batched, for the tokens of one recorded call."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in call.lengths]
    seconds, lengths = timed_generate(engine, call.prompts, params, repeats)
    if lengths != call.lengths:
        raise RuntimeError(
            "the baseline generated other lengths than the step: "
            f"{sum(lengths)} against {sum(call.lengths)} tokens"
        )
    return seconds


def prefill_seconds(engine: VLLMEngine, call: Requests, repeats: int = 1) -> tuple[float, int]:
    """(seconds, tokens) of plain prefill of a recorded log-likelihood call's token ids
    (prompt + completion, one token generated, no log-probabilities asked)."""
    from vllm import SamplingParams

    ids = [
        engine.prompt_token_ids(p) + list(c)
        for p, c in zip(call.prompts, call.completions, strict=True)
    ]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    requests = [{"prompt_token_ids": x} for x in ids]
    seconds = []
    for _ in range(repeats):
        engine.llm.reset_prefix_cache()
        start_s = time.perf_counter()
        engine.llm.generate(requests, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start_s)
    return float(np.median(seconds)), sum(len(x) for x in ids)


def logprob_seconds(engine: VLLMEngine, call: Requests, repeats: int = 1) -> float:
    """Seconds of the recorded log-likelihood call itself on the unperturbed model."""
    seconds = []
    for _ in range(repeats):
        engine.llm.reset_prefix_cache()
        start_s = time.perf_counter()
        engine.completion_logprobs(call.prompts, call.completions)
        seconds.append(time.perf_counter() - start_s)
    return float(np.median(seconds))
