"""How many engines a run starts and where: `num_engines` and `engines_per_gpu` resolved,
`auto` included.

Several full-rank engines on one card generate several members at once, but only under CUDA
MPS; without it they take turns (on one H200, 8 engines of a 135M model gave 6.2x one
engine's members/s under MPS and 1.8x without). So `auto` (both options' default) puts as
many engines on one card as its memory holds, at most MAX_ENGINES_PER_GPU, where MPS runs,
and one engine where it does not, with a note saying what MPS would allow. ES Lab does not
start MPS itself: it is a daemon per machine that serves one Unix user at a time.

What a run occupies must be known before its Ray job is placed (`plan`, which the scheduler
reads): with auto that is one card's worth, `tensor_parallel_size` GPUs, however many
engines share it. Those engines are Ray actors that ask for their share of the card, so the
job itself holds no GPU, and even a lone engine (no MPS) runs in an actor. The number of
engines is chosen inside the job (`arrange`), from the card a small Ray task finds
(`probe_card`) and each engine's memory (`run_engine_memory`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.pool import actor_env, cuda_mps_running
from engine.backends.vllm.cpu.resources import (
    DTYPE_BYTES,
    context_length,
    kv_bytes_per_token,
    model_config,
)
from engine.config import RunConfig
from engine.config.schema import AUTO
from engine.noise import noise_table_len

GIB = 2**30
MAX_ENGINES_PER_GPU = 8
"""The most engines auto puts on one card: 8 was the most measured (135M model, H200, MPS)."""
CARD_SHARE = 0.9
"""Share of the card's memory all its engines take together (vLLM's default for one)."""
ENGINE_OVERHEAD_BYTES = 2 * GIB
"""Per engine, besides weights, training state and KV cache: its CUDA context, activations
of vLLM's profile run, CUDA graphs and the sampler's buffers (an allowance, not measured
per model)."""
PROMPT_TOKENS = 512
"""Prompt tokens assumed per sequence when sizing the smallest KV cache auto accepts."""
VLLM_MAX_NUM_SEQS = 256
"""vLLM's default max_num_seqs on a GPU, where max_num_seqs is unset."""
MPS_COMMAND = "nvidia-cuda-mps-control -d"


@dataclass(frozen=True)
class Plan:
    """What a run occupies, known before it starts: the scheduler places its Ray job by it."""

    num_engines: int | None
    """None: chosen inside the job from the card (auto)."""
    engines_per_gpu: int | None
    in_actors: bool
    """The engines run in Ray actors, which ask for their GPUs themselves."""
    demand: dict[str, float]
    """GPUs (or CPUs, on a CPU-only cluster) the run's engines occupy together."""
    job_gpus: float
    """GPUs the job's own process holds: those of an engine that computes inside it."""


def plan(config: Mapping[str, Any], *, gpus: bool) -> Plan:
    """The plan of a run from its flat configuration (`num_engines`, `engines_per_gpu`,
    `tensor_parallel_size`; missing means 1, as in configurations stored before auto) on a
    cluster with GPUs or without.

    auto with a number of engines per GPU E means one card's worth, E engines; engines_per_gpu
    auto with a number of engines means one engine a GPU. An engine of several GPUs
    (tensor_parallel_size > 1) gets them to itself, and so does an engine of a population in
    adapter slots (perturbation lora or full_batched), whose batched call already fills its
    card. Only both auto on full-rank engines of one GPU
    leave the number to the job."""
    tp = int(config.get("tensor_parallel_size") or 1)
    num, per = _setting(config, "num_engines"), _setting(config, "engines_per_gpu")
    if not gpus:
        engines = 1 if num == AUTO else int(num)
        return Plan(engines, 1, engines > 1, {"CPU": float(engines)}, 0.0)
    alone = tp > 1 or config.get("perturbation") in ("lora", "full_batched")
    if num == AUTO and per == AUTO and not alone:
        return Plan(None, None, True, {"GPU": 1.0}, 0.0)
    per = 1 if per == AUTO else int(per)
    engines = per if num == AUTO else int(num)
    if engines == 1:  # it computes inside the job, alone on its GPUs
        return Plan(1, 1, False, {"GPU": float(tp)}, float(tp))
    return Plan(engines, per, True, {"GPU": engines * tp / per}, 0.0)


def _setting(config: Mapping[str, Any], name: str) -> int | str:
    value = config.get(name)
    return AUTO if value == AUTO else int(value or 1)


@dataclass(frozen=True)
class Card:
    """The GPU where a run's engines compute, as the probe found it."""

    name: str
    total_bytes: int
    mps: bool


@dataclass(frozen=True)
class EngineMemory:
    """What one full-rank engine holds on its card."""

    weights: int
    training_state: int
    """fp32 master, serving-dtype snapshot and noise table: allocated after vLLM's start,
    outside the memory share vLLM is given."""
    kv_cache: int
    """The smallest KV cache auto accepts: a member's sequences in flight at once."""
    overhead: int = ENGINE_OVERHEAD_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.training_state + self.kv_cache + self.overhead


def engine_memory(
    model_dir: str | Path,
    *,
    dtype: str,
    max_model_len: int | None,
    max_num_seqs: int | None,
    sequences: int,
    max_tokens: int,
) -> EngineMemory | None:
    """One engine's memory for the model in `model_dir`: its weights (safetensors headers),
    the master, snapshot and noise table built from them (worker_extension.es_init), and a
    KV cache for one member's `sequences` in flight (at most max_num_seqs), each max_tokens
    plus PROMPT_TOKENS long, and at least one sequence of the context length. None where
    the folder has no safetensors or config.json to read."""
    counts = weight_counts(model_dir)
    hf_config = model_config(model_dir)
    if counts is None or hf_config is None:
        return None
    parameters, largest = counts
    width = DTYPE_BYTES.get(dtype, 2)
    context = max_model_len or context_length(hf_config)
    in_flight = min(max_num_seqs or VLLM_MAX_NUM_SEQS, sequences)
    tokens = max(context, in_flight * min(context, max_tokens + PROMPT_TOKENS))
    return EngineMemory(
        weights=parameters * width,
        training_state=parameters * (4 + width) + noise_table_len(largest) * width,
        kv_cache=tokens * kv_bytes_per_token(hf_config, dtype),
    )


def run_engine_memory(config: RunConfig, model_dir: str | Path) -> EngineMemory | None:
    """`engine_memory` of a run: a member's sequences are its batch's prompts times n."""
    m = config.model
    return engine_memory(
        model_dir,
        dtype=m.dtype,
        max_model_len=m.max_model_len,
        max_num_seqs=m.max_num_seqs,
        sequences=config.data.data_batch_size * config.sampling.n,
        max_tokens=config.sampling.max_tokens,
    )


def weight_counts(model_dir: str | Path) -> tuple[int, int] | None:
    """(parameters, entries of the largest tensor) from the headers of the folder's
    safetensors files, without reading their tensors; None where it has none."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    sizes = []
    for file in files:
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        sizes += [math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__"]
    return sum(sizes), max(sizes)


@dataclass(frozen=True)
class Arrangement:
    """The engines a run starts: how many, how many a card, and what each is given."""

    num_engines: int
    engines_per_gpu: int
    in_actors: bool
    one_node: bool = False
    """The engines stay on one node (auto's engines of one card)."""
    gpu_memory_utilization: float | None = None
    """None: the configuration's (vLLM's default where unset)."""
    kv_cache_memory_bytes: int | None = None
    """Each engine's KV cache where engines share a card and vLLM takes a size, so they
    need not profile one after another."""
    notes: tuple[str, ...] = ()
    """For the run's events: what auto chose and why."""

    def engine_args(self) -> dict[str, Any]:
        """vLLM engine arguments of this arrangement."""
        if self.kv_cache_memory_bytes is None:
            return {}
        return {"kv_cache_memory_bytes": self.kv_cache_memory_bytes}


def choose(
    card: Card,
    memory: EngineMemory | None,
    *,
    population: int,
    in_actors: bool,
    card_share: float = CARD_SHARE,
    sized_kv_cache: bool = True,
) -> Arrangement:
    """auto's engines on `card`: as many as `card_share` of its memory holds of `memory`
    (at most MAX_ENGINES_PER_GPU and `population`) under MPS, else one with a note of what
    MPS would allow. Engines that share the card each get an even slice of it:
    gpu_memory_utilization is the slice less the training state, which vLLM does not see,
    and with `sized_kv_cache` (vLLM takes kv_cache_memory_bytes) a KV cache of what is left
    of the slice."""
    where = f"{card.name} ({card.total_bytes / GIB:.0f} GiB)"
    if memory is None:
        return _one(
            in_actors,
            f"one engine on {where}: the model folder has no safetensors "
            "and config.json to size more by",
        )
    budget = int(card.total_bytes * card_share)
    engines = max(1, min(MAX_ENGINES_PER_GPU, population, budget // memory.total))
    each = f"about {memory.total / GIB:.1f} GiB each"
    if not card.mps and engines > 1:
        return _one(
            in_actors,
            f"one engine on {where}, as CUDA MPS does not run there; under MPS the card "
            f"would hold {engines} engines of this model ({each}), which generate members "
            f"at once: start it on that machine before the run ({MPS_COMMAND}; docs/gpu.md)",
        )
    if engines == 1:
        return _one(in_actors, f"one engine on {where}, whose memory has room for one ({each})")
    share = budget // engines
    vllm_share = share - memory.training_state
    kv = vllm_share - memory.weights - memory.overhead if sized_kv_cache else None
    start = "at once" if kv is not None else "one after another"
    return Arrangement(
        engines,
        engines,
        True,
        one_node=True,
        gpu_memory_utilization=math.floor(vllm_share / card.total_bytes * 1e4) / 1e4,
        kv_cache_memory_bytes=kv,
        notes=(
            f"engines auto: {engines} engines share {where} under CUDA MPS, "
            f"{share / GIB:.1f} GiB each (weights {memory.weights / GIB:.1f}, master, "
            f"snapshot and noise table {memory.training_state / GIB:.1f}, KV cache "
            f"{(kv if kv is not None else vllm_share - memory.weights) / GIB:.1f}); they "
            f"start {start}",
        ),
    )


def _one(in_actors: bool, why: str) -> Arrangement:
    return Arrangement(1, 1, in_actors, notes=(f"engines auto: {why}",))


def arrange(config: RunConfig, model_dir: str | Path) -> Arrangement:
    """The run's engines: its plan where that is fixed, else auto's choice on the card a
    probe finds. Without a GPU (the CPU build of vLLM), one engine in this process."""
    m = config.model
    gpus = _cuda_platform()
    planned = plan(config.to_flat(), gpus=gpus)
    if planned.num_engines is not None:
        return Arrangement(planned.num_engines, planned.engines_per_gpu or 1, planned.in_actors)
    in_job = bool(os.environ.get("RAY_ADDRESS"))
    card = probe_card(in_job)
    if card is None:
        return Arrangement(1, 1, False)
    return choose(
        card,
        run_engine_memory(config, model_dir),
        population=config.es.population_size,
        # in a Ray job the engines are actors (the job holds no GPU); here, one runs in-process
        in_actors=in_job,
        card_share=m.gpu_memory_utilization or CARD_SHARE,
        sized_kv_cache=vllm_takes_kv_cache_size(),
    )


def _cuda_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


def vllm_takes_kv_cache_size() -> bool:
    """Whether this vLLM's engine arguments include kv_cache_memory_bytes."""
    from vllm.engine.arg_utils import EngineArgs

    return "kv_cache_memory_bytes" in {f.name for f in dataclasses.fields(EngineArgs)}


def card_here() -> Card:
    """This process's first GPU, read through NVML (vLLM's platform), which creates no CUDA
    context: a context would hold memory on the card for as long as the process lives."""
    from vllm.platforms import current_platform

    return Card(
        current_platform.get_device_name(0),
        int(current_platform.get_device_total_memory(0)),
        cuda_mps_running(),
    )


def probe_card(in_ray_job: bool) -> Card | None:
    """The card the run's engines will share: in a Ray job, read by a task that asks for one
    GPU (so Ray names the card), whose worker then exits; else this machine's first GPU.
    None where the Ray cluster has no GPU."""
    if not in_ray_job:
        return card_here()
    import ray

    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    if ray.cluster_resources().get("GPU", 0) <= 0:
        return None
    task = ray.remote(num_gpus=1, num_cpus=0, max_calls=1)(card_here)
    return ray.get(task.options(runtime_env={"env_vars": actor_env()}).remote())
