"""The trainer's side of `perturbation: lora`: put each step's members into the engines'
LoRA slots, evaluate the whole population in one engine call, and apply the update
(engine/lowrank/factors.py has the math).

Members go to vLLM's adapter slots from their seeds, drawn by the engine's worker
(engine/backends/vllm/lora_slots.py): nothing but (slot, seed, scale) leaves this process,
and no member is ever written to a file. Every prompt of every member goes into one
`generate` call with one slot per prompt, which vLLM batches across adapters (multi-LoRA);
with several engines the members are split over them. In adapter mode the trained adapter's
factors go in front of every member's (rank 2r), read by the workers from one file a step,
and the update folds the members' factors into it here, drawn from this process's copy of
the engines' noise table (built once, on the first update: about half a second for the
default table of 2**26 entries on the CPU), so they are the factors the engines served.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.es import Member
from engine.lowrank.factors import (
    LoraTarget,
    TrainedAdapter,
    find_targets,
    layer_scales,
    parse_layers,
    parse_modules,
    write_adapter,
)
from engine.noise import shared_noise_table
from engine.scoring.batch import ScoredBatch
from engine.tasks import GenerateAndScore

ADAPTER_DIR = "adapter"
"""Folder of the trained adapter inside the output folder and checkpoints (adapter mode)."""

FACTORS_FILE = "eslab_factors.safetensors"
"""The trained adapter's exact fp32 factors (delta = B A), next to the PEFT files."""


def engine_args(config: RunConfig) -> dict[str, Any]:
    """Extra `LLM(...)` arguments of the engines of a lora run (multi-LoRA serving)."""
    from engine.backends.vllm.lora_slots import lora_llm_args

    lora = config.lora
    rank = lora.lora_rank * (2 if lora.lora_update == "adapter" else 1)
    return lora_llm_args(config.es.population_size, rank, parse_modules(lora.lora_target_modules))


class LoraPopulation:
    """Targets, per-layer scales and (adapter mode) the trained adapter of one run."""

    def __init__(self, config: RunConfig, model_dir: str | Path) -> None:
        from safetensors import safe_open

        from engine.backends.vllm.hf_export import source_tensor_specs

        lora = config.lora
        self.model_dir = str(model_dir)
        self.rank, self.alpha, self.mode = lora.lora_rank, lora.lora_alpha, lora.lora_update
        specs = source_tensor_specs(model_dir)
        if not specs:
            raise ValueError(
                f"model: no safetensors weights in {model_dir} (lora mode reads "
                "the shapes and scales of its target layers there)"
            )
        self.targets: list[LoraTarget] = find_targets(
            specs, parse_modules(lora.lora_target_modules), parse_layers(lora.lora_target_layers)
        )
        if not self.targets:
            raise ValueError(
                f"no LoRA target in {model_dir} for lora_target_modules "
                f"{lora.lora_target_modules!r}, layers {lora.lora_target_layers!r}"
            )
        wanted = {f"{t.name}.weight" for t in self.targets}
        weights = {}
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                weights.update({k: f.get_tensor(k) for k in f.keys() if k in wanted})  # noqa: SIM118
        self.scales = layer_scales(weights, self.targets, lora.lora_noise_scaling)
        self.trained = TrainedAdapter(self.targets, self.rank) if self.mode == "adapter" else None
        self.root: Path | None = None  # adapter mode: where the trained factors go each step

    # ---- one step ---------------------------------------------------------------------------

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
        start = time.perf_counter()
        slots = [m.index for m in members for _ in task.prompts]
        pool.set_lora_members(
            {m.index: (m.seed, m.sign * noise_std) for m in members}, slots, self._member_spec(step)
        )
        written = time.perf_counter()
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
        pool.last_stats = {"perturb_s": written - start, "restore_s": 0.0}
        return results

    def _member_spec(self, step: int) -> dict[str, Any]:
        """What the workers need to draw this step's members (lora_slots.write_member_slots):
        targets, rank, scales and, in adapter mode, the file of the trained factors."""
        from engine.backends.vllm.lora_slots import lora_update_spec

        spec = lora_update_spec(self.targets, self.rank, self.scales)
        if self.trained is not None:
            from safetensors.torch import save_file

            from engine.backends.vllm.lora_slots import tmpfs_dir

            if self.root is None:
                self.root = Path(tempfile.mkdtemp(prefix="eslab-lora-", dir=tmpfs_dir()))
            for old in self.root.glob("trained-*.safetensors"):
                old.unlink()
            path = self.root / f"trained-{step}.safetensors"
            save_file(self.trained.state(), str(path))
            spec["trained"] = str(path)
        return spec

    def update(self, pool: EnginePool, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """Merge into every engine's fp32 master, or fold into the trained adapter."""
        if self.trained is not None:
            # the engines' table, held here too: the factors the workers served (noise.py)
            table = shared_noise_table(*pool.call_engine(0, "noise_table"))
            self.trained.add(table, seeds, coefficients, self.scales)
            return
        from engine.backends.vllm.lora_slots import lora_update_spec

        spec = lora_update_spec(self.targets, self.rank, self.scales)
        pool.broadcast(
            "lora_update", spec, [int(s) for s in seeds], [float(c) for c in coefficients]
        )
        pool.verify_in_sync()

    # ---- saving -----------------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path | None:
        """Adapter mode: the trained adapter as a PEFT folder `folder/adapter`."""
        if self.trained is None:
            return None
        from safetensors.torch import save_file

        path = write_adapter(
            Path(folder) / ADAPTER_DIR,
            self.trained.factors,
            rank=self.rank,
            alpha=self.alpha,
            base_model=self.model_dir,
        )
        # The PEFT file stores B / (alpha / r); the exact fp32 factors go beside it for resume.
        save_file(self.trained.state(), str(path / FACTORS_FILE))
        return path

    def load(self, folder: str | Path) -> None:
        """Adapter mode: read back the trained adapter written by `save` (exact, fp32)."""
        if self.trained is None:
            return
        from safetensors.torch import load_file

        self.trained.load_state(load_file(str(Path(folder) / ADAPTER_DIR / FACTORS_FILE)))

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
