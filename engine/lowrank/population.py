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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.lowrank.factors import (
    LoraTarget,
    TrainedAdapter,
    layer_scales,
    parse_modules,
    write_adapter,
)
from engine.noise import shared_noise_table
from engine.slot_population import SlotPopulation, run_targets

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


class LoraPopulation(SlotPopulation):
    """Targets, per-layer scales and (adapter mode) the trained adapter of one run; the
    members' evaluation in one call is SlotPopulation's."""

    def __init__(self, config: RunConfig, model_dir: str | Path) -> None:
        from safetensors import safe_open

        lora = config.lora
        self.model_dir = str(model_dir)
        self.rank, self.alpha, self.mode = lora.lora_rank, lora.lora_alpha, lora.lora_update
        self.targets: list[LoraTarget] = run_targets(
            config, model_dir, "lora mode reads the shapes and scales of its target layers there"
        )
        wanted = {f"{t.name}.weight" for t in self.targets}
        weights = {}
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                weights.update({k: f.get_tensor(k) for k in f.keys() if k in wanted})  # noqa: SIM118
        self.scales = layer_scales(weights, self.targets, lora.lora_noise_scaling)
        self.trained = TrainedAdapter(self.targets, self.rank) if self.mode == "adapter" else None
        self.root: Path | None = None  # adapter mode: where the trained factors go each step

    # ---- one step ----------------------------------------------------------------------------

    def member_spec(self, step: int) -> dict[str, Any]:
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

    def metrics(self) -> dict[str, float]:
        return {mk.LORA_RANK: float(self.rank)}

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
