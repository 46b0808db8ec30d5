"""Before the first step: check what a run needs (reward functions, model folder, datasets)
so that a bad run is refused before anything is stored or started, and set up what the loop
uses (the data and its batches, the engines, a population held in adapter slots)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.backends.arrangement import arrange
from engine.backends.pool import EnginePool
from engine.batches import Batches, Position
from engine.config import RunConfig
from engine.data.datasets import Example, load_dataset
from engine.lowrank.population import LoraPopulation
from engine.model_files import check_model_dir, local_model, resolve_model
from engine.paths import resolve_path
from engine.scoring.sources import function_paths
from engine.sink import Sink
from engine.slot_population import NoisePopulation, SlotPopulation, slot_engine_args


@dataclass(frozen=True)
class TrainingData:
    """The datasets of a run, its batching and the number of steps that makes."""

    train_set: list[Example]
    eval_set: list[Example]
    batches: Batches
    total_steps: int
    eval_parts: dict[str, range] = field(default_factory=dict)
    """Each of data.eval_sets as its rows of eval_set (which holds eval_file's rows first)."""

    def examples(self, position: Position) -> list[Example]:
        return [self.train_set[i] for i in self.batches.indices(position)]

    def epoch(self, position: Position) -> float:
        """Epochs done at `position`, as a fraction."""
        return position.epoch + position.batch / self.batches.per_epoch


def load_data(config: RunConfig) -> TrainingData:
    kind = config.data.prompt_format
    train_set = load_dataset(resolve_path(config.data.train_file), expected_format=kind)
    eval_set = (
        load_dataset(resolve_path(config.data.eval_file), expected_format=kind)
        if config.data.eval_file
        else []
    )
    eval_parts: dict[str, range] = {}
    for name, path in config.data.eval_set_files().items():
        start = len(eval_set)
        eval_set += load_dataset(resolve_path(path), expected_format=kind)
        eval_parts[name] = range(start, len(eval_set))
    batches = Batches(len(train_set), config.data.data_batch_size, config.data.seed)
    steps = config.total_steps(batches.per_epoch)
    return TrainingData(train_set, eval_set, batches, steps, eval_parts)


def plan_total_steps(config: RunConfig) -> int:
    """Check the inputs a run needs before it starts (reward functions, model folder,
    datasets, and that each dataset row gives the reward functions exactly the arguments
    they name) and return its number of steps: the batches its loop draws, which the progress
    bar and the dashboard count the run's progress against (a skipped LBES step uses up a
    batch, so it counts there, though not in the global step of the metrics)."""
    from engine.rewards import check_arguments, load_reward_function

    functions = {path: load_reward_function(path) for path in function_paths(config)}
    if (folder := local_model(config.model.model)) is not None:
        check_model_dir(folder)  # a hub id is checked when it is downloaded, by the worker
    data = load_data(config)
    sets = config.data.eval_set_files()
    first_set = min((rows.start for rows in data.eval_parts.values()), default=len(data.eval_set))
    datasets = [
        (f"data.train_file {config.data.train_file}", data.train_set),
        (f"data.eval_file {config.data.eval_file}", data.eval_set[:first_set]),
        *(
            (f"data.eval_sets {name}={sets[name]}", data.eval_set[rows.start : rows.stop])
            for name, rows in data.eval_parts.items()
        ),
    ]
    for path, func in functions.items():
        for where, examples in datasets:
            check_arguments(path, func, (e.reward_func_args for e in examples), where)
    return data.total_steps


def model_folder(config: RunConfig) -> Path:
    """The run's model as a folder here: the local folder it names, else the Hugging Face hub
    repository of that id, downloaded into the hub cache (a clear ModelError where the hub
    cannot be reached). Local folders are taken as they are: plan_total_steps checked them."""
    local = local_model(config.model.model)
    return local if local is not None and local.exists() else resolve_model(config.model.model)


def start_pool(config: RunConfig, sink: Sink) -> EnginePool:
    """The run's engines, arranged as num_engines and engines_per_gpu say (auto: chosen from
    the card, engine/backends/arrangement.py); what auto chose, and what makes an arrangement
    slow (engines time-sliced on a GPU), go to the run's events, where the dashboard shows
    them."""
    m = config.model
    folder = model_folder(config)
    arrangement = arrange(config, folder)
    for note in arrangement.notes:
        sink.log_event("info", note)
    pool = EnginePool(
        str(folder),
        num_engines=arrangement.num_engines,
        engines_per_gpu=arrangement.engines_per_gpu,
        in_actors=arrangement.in_actors,
        one_node=arrangement.one_node,
        dtype=m.dtype,
        max_model_len=m.max_model_len,
        tensor_parallel_size=m.tensor_parallel_size,
        gpu_memory_utilization=arrangement.gpu_memory_utilization or m.gpu_memory_utilization,
        max_num_seqs=m.max_num_seqs,
        # False leaves the platform's choice (eager on the CPU, CUDA graphs on a GPU).
        enforce_eager=True if m.enforce_eager else None,
        seed=config.data.seed,
        extra_llm_args={
            **m.vllm_flags(),
            **slot_engine_args(config),
            **arrangement.engine_args(),
        },
        lora_kernels=config.lora.lora_kernels,
    )
    for warning in pool.warnings:
        sink.log_event("warning", warning)
    return pool


def start_slots(config: RunConfig, sink: Sink) -> SlotPopulation | None:
    """The population held in the engines' adapter slots (`perturbation: lora` or
    `full_batched`), else None (members perturb the full weights one at a time)."""
    perturbation = config.lora.perturbation
    if perturbation == "full_batched":
        population = NoisePopulation(config, model_folder(config))
        sink.log_event(
            "info",
            f"perturbation full_batched: {len(population.targets)} target modules, "
            "the whole population in one engine call",
        )
        return population
    if perturbation != "lora":
        return None
    lora = LoraPopulation(config, model_folder(config))
    sink.log_event(
        "info",
        f"perturbation lora: rank {config.lora.lora_rank}, "
        f"{len(lora.targets)} target modules, update {lora.mode}",
    )
    return lora
