"""Populations served from the engines' adapter slots: every member's prompts in one engine
call (`perturbation: lora` and `full_batched`).

vLLM's multi-LoRA machinery gives each token of a batch its adapter slot; a member held in a
slot is served beside all the others in one `generate` call, one slot per prompt. What a
slot holds is the mode's: a low-rank member's factors (engine/lowrank/population.py), or a
full-rank member's noise header (`NoisePopulation` here, the engine's side in
engine/backends/vllm/member_noise.py). Nothing but (slot, seed, scale) and the mode's spec
leaves this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.es import Member
from engine.lowrank.factors import LoraTarget, find_targets, parse_layers, parse_modules
from engine.scoring.batch import ScoredBatch
from engine.tasks import CompletionLogprobs, GenerateAndScore


def run_targets(config: RunConfig, model_dir: str | Path, why: str) -> list[LoraTarget]:
    """The target linear modules of a run (lora_target_modules in lora_target_layers) in the
    model folder's checkpoint; a folder without weights, or targets it lacks, are errors
    (`why` says what the mode reads there)."""
    from engine.backends.vllm.hf_export import source_tensor_specs

    lora = config.lora
    specs = source_tensor_specs(model_dir)
    if not specs:
        raise ValueError(f"model: no safetensors weights in {model_dir} ({why})")
    targets = find_targets(
        specs, parse_modules(lora.lora_target_modules), parse_layers(lora.lora_target_layers)
    )
    if not targets:
        raise ValueError(
            f"no target in {model_dir} for lora_target_modules "
            f"{lora.lora_target_modules!r}, layers {lora.lora_target_layers!r}"
        )
    return targets


class SlotPopulation:
    """A population whose members the engines hold in adapter slots; subclasses say what a
    slot holds (`member_spec`) and how the update is applied."""

    def evaluate(
        self,
        pool: EnginePool,
        members: Sequence[Member],
        noise_std: float,
        task: GenerateAndScore,
        step: int,
    ) -> list[ScoredBatch]:
        """All members' completions in one engine call, scored per member, in member order.
        `pool.last_stats` gets the time of writing the members' slots as the perturb phase."""
        slots, written = self._write(pool, members, noise_std, len(task.prompts), step)
        s = task.sampling
        outputs = pool.generate(
            task.prompts * len(members),
            n=s.n,
            temperature=s.temperature,
            max_tokens=s.max_tokens,
            seed=s.seed,
            adapters=slots,
        )
        generated = time.perf_counter()
        per_member = len(task.prompts)
        results = []
        for i in range(len(members)):
            score_start = time.perf_counter()
            batch = task.score(outputs[i * per_member : (i + 1) * per_member])
            batch.timings = {
                "generation": (generated - written) / len(members),
                "reward": time.perf_counter() - score_start,
            }
            results.append(batch)
        return results

    def log_likelihoods(
        self,
        pool: EnginePool,
        members: Sequence[Member],
        noise_std: float,
        task: CompletionLogprobs,
        step: int,
    ) -> list[np.ndarray]:
        """Every member's mean log-likelihood of the task's completions (LBES), all members
        in one engine call, in member order."""
        slots, _ = self._write(pool, members, noise_std, len(task.prompts), step)
        values = pool.completion_logprobs(
            task.prompts * len(members), task.completions * len(members), adapters=slots
        )
        per_member = len(task.prompts)
        return [
            np.asarray(values[i * per_member : (i + 1) * per_member]) for i in range(len(members))
        ]

    def _write(
        self, pool: EnginePool, members: Sequence[Member], noise_std: float, prompts: int, step: int
    ) -> tuple[list[int], float]:
        """Put the members into the engines' slots: (the slot of each of the call's prompts,
        members in order, `prompts` each; when the writing ended). `pool.last_stats` gets
        its time as the perturb phase."""
        start = time.perf_counter()
        slots = [m.index for m in members for _ in range(prompts)]
        pool.set_lora_members(
            {m.index: (m.seed, m.sign * noise_std) for m in members}, slots, self.member_spec(step)
        )
        written = time.perf_counter()
        pool.last_stats = {"perturb_s": written - start, "restore_s": 0.0}
        return slots, written

    def member_spec(self, step: int) -> dict[str, Any]:
        """What the workers need to fill this step's slots."""
        raise NotImplementedError

    def update(self, pool: EnginePool, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """Apply the step's update from (seed, coefficient) pairs."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """The mode's own metrics of every step."""
        return {}

    def save(self, folder: str | Path) -> Path | None:
        """What the mode keeps beside a checkpoint's weights (a folder), else None."""
        return None

    def load(self, folder: str | Path) -> None:
        """Read back what `save` wrote."""

    def close(self) -> None:
        """Remove the mode's temporary files."""


class NoisePopulation(SlotPopulation):
    """`perturbation: full_batched`: full-rank members, each a noise header in a slot, whose
    noise every targeted linear layer adds to its product for the member's tokens; the
    update is full rank's, on the targeted weights."""

    def __init__(self, config: RunConfig, model_dir: str | Path) -> None:
        from engine.backends.vllm.member_noise import noise_spec

        self.targets = run_targets(
            config, model_dir, "perturbation full_batched reads the shapes of its targets there"
        )
        self.spec = noise_spec(
            [[t.name, t.layer, t.module, t.in_features, t.out_features] for t in self.targets]
        )

    def member_spec(self, step: int) -> dict[str, Any]:
        return self.spec

    def update(self, pool: EnginePool, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        pool.broadcast(
            "lora_update", self.spec, [int(s) for s in seeds], [float(c) for c in coefficients]
        )
        pool.verify_in_sync()


def slot_engine_args(config: RunConfig) -> dict[str, Any]:
    """Extra `LLM(...)` arguments of the engines of a run whose population is held in
    adapter slots (multi-LoRA for lora's rank, or full_batched's member noise); none for
    perturbation full."""
    perturbation = config.lora.perturbation
    if perturbation == "lora":
        from engine.lowrank.population import engine_args

        return engine_args(config)
    if perturbation == "full_batched":
        from engine.backends.vllm.member_noise import noise_llm_args

        return noise_llm_args(
            config.es.population_size, parse_modules(config.lora.lora_target_modules)
        )
    return {}
