"""The two sides of bench/gpu/reference.py, each run in its own process by it: ES Lab's
full-rank iteration as bench/gpu/utilization.py runs it, and ES at Scale's own trainer from
the user's snapshot. Both take the same prompts (the countdown puzzles in DATA, ES at Scale's
raw prompts), population, prompts a member and token budget, and time whole iterations after
one warm-up.

Each side hands its record to `report` after every stage (engine started, each iteration),
so a side that fails or is stopped later still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.gpu import reference_shims as shims

Report = Callable[[dict], None]

SIGMA = 0.001
"""ES at Scale's train.py default noise scale; its default alpha is SIGMA / 2."""
SEED = 42
"""ES at Scale's train.py default --seed."""
REWARD_TIMEOUT_S = 60
"""The trainer's default reward timeout."""
FALLBACK_EXECUTOR = "uni"
"""The executor of a second try when the trainer's own ("ray") fails to start here."""
RAY_RESTART_WAIT_S = 5
COUNTDOWN_JSON = "countdown.json"  # engine.data.countdown_es_at_scale.JSON_NAME


def countdown_task(data: Path) -> dict[str, str]:
    """ES Lab's run on the puzzles' raw prompts with ES at Scale's grading rules."""
    return {
        "train_file": str(data / "train.parquet"),
        "prompt_format": "raw",
        "reward_func_path": "engine.rewards.countdown_es_at_scale.compute_score",
    }


def device_info() -> dict[str, str]:
    import torch
    import vllm

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"card": card, "vllm": vllm.__version__, "python": sys.version.split()[0]}


def run_eslab(args: argparse.Namespace, data: Path, report: Report) -> None:
    """utilization.py's full-rank row of args.engines engines (or auto's), on the countdown
    prompts."""
    from bench.gpu import utilization
    from engine import metrics as mk

    record: dict = {"engines": args.engines, **device_info()}
    report(record)
    start = time.perf_counter()
    pool = utilization.full_rank_pool(args, args.engines, utilization.common_options(args))
    record["start_s"] = time.perf_counter() - start
    record["engines"] = pool.num_engines  # what auto chose, with --engines auto
    report(record)
    try:
        config = utilization.es_config(args, task=countdown_task(data))
        means = utilization.es_iteration(pool, config)
    finally:
        pool.shutdown()
    record["step_s"] = means[mk.time_key("step")]
    record["tokens"] = means[utilization.TOKENS]
    record["phases_s"] = {k: v for k, v in means.items() if k.startswith("time/")}
    report(record)


def member_seeds(iteration: int, population: int) -> list[int]:
    """One seed a member from the iteration's own generator, as ES at Scale's fit draws them
    (integers below 2**30 from NumPy's default generator seeded with seed + iteration)."""
    rng = np.random.default_rng(SEED + iteration)
    return [int(s) for s in rng.integers(0, 2**30, size=population)]


def start_engines(executor: str) -> list[str]:
    """Ray started for the trainer, its engines on vLLM's `executor` backend (the trainer's
    own is "ray"); the patches that took."""
    patches = []
    if executor != "ray":
        os.environ[shims.EXECUTOR_SETTING] = executor  # read by Ray's workers at their start
        patches += shims.set_executor(executor)
    return patches + shims.start_ray()


def restart_ray() -> None:
    """Ray and every process of its cluster gone (the failed trainer's detached placement
    group, which holds the GPU, with them), and a moment for the GPU's memory to come back."""
    import ray

    ray.shutdown()
    time.sleep(RAY_RESTART_WAIT_S)


def run_reference(args: argparse.Namespace, data: Path, report: Report) -> None:
    """ES at Scale's trainer with one engine on the visible GPU: its engine launch, and its
    train_step (perturb, generate, restore and score member by member, then its update and
    weight broadcast) once per iteration, as its fit loop calls it, without fit's evaluation
    and checkpoint."""
    reference = Path(args.reference).resolve()
    record: dict = {"files_sha256": shims.check_snapshot(reference), "patches": []}
    report(record)
    record["patches"] += shims.add_to_path(reference)
    record["patches"] += shims.vllm_import_shims()
    record.update(device_info())
    # the trainer sets CUDA_VISIBLE_DEVICES to its use_gpus: keep the GPU this machine lends
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus

    from es_at_scale.reward_function.countdown_grader import countdown_reward_fn
    from es_at_scale.template_function.apply_template import countdown_template
    from es_at_scale.trainer.es_trainer import EvolutionStrategiesTrainer

    puzzles = json.loads((data / COUNTDOWN_JSON).read_text())[: args.prompts]
    contexts = [p["context"] for p in puzzles]
    targets = [{"numbers": p["numbers"], "target": p["target"]} for p in puzzles]

    def build() -> EvolutionStrategiesTrainer:
        return EvolutionStrategiesTrainer(
            model_name=args.model,
            checkpoint=None,
            sigma=SIGMA,
            alpha=SIGMA / 2,
            population_size=args.population,
            reward_shaping="z-scores",
            num_iterations=args.steps + 1,
            max_tokens=args.max_tokens,
            batch_size=args.prompts,
            mini_batch_size=args.prompts,  # one generate call a member, as ES Lab's
            reward_function=countdown_reward_fn,
            template_function=countdown_template,
            train_dataloader=None,  # train_step is given the prompts
            eval_dataloader_dict={},
            eval_freq=args.steps + 2,
            n_vllm_engines=1,
            n_gpu_per_vllm_engine=1,
            logging="none",
            use_gpus=gpus,
            global_seed=SEED,
            output_directory=tempfile.mkdtemp(prefix="es-at-scale-"),
            save_best_models=False,
            experiment_name="bench-reference",
            reward_function_timeout=REWARD_TIMEOUT_S,
        )

    record["patches"] += start_engines(args.reference_executor)
    report(record)
    start = time.perf_counter()
    try:
        trainer = build()
    except Exception as exc:
        if args.reference_executor != "ray":
            raise
        # its own executor failed on this vLLM: once more with the model in the engine actor
        record[f"{args.reference_executor}_executor_error"] = f"{type(exc).__name__}: {exc}"
        restart_ray()
        record["patches"] += start_engines(FALLBACK_EXECUTOR)
        report(record)
        start = time.perf_counter()
        trainer = build()
    record["start_s"] = time.perf_counter() - start
    count = shims.TokenCount(trainer)
    record["patches"].append(count.PATCH)
    record["iterations"] = []
    report(record)
    try:
        for iteration in range(args.steps + 1):
            start = time.perf_counter()
            trainer.train_step(
                iteration=iteration,
                seeds=member_seeds(iteration, args.population),
                input_text=[countdown_template(c) for c in contexts],
                target_text=targets,
            )
            seconds = time.perf_counter() - start
            record["iterations"].append({"s": seconds, "tokens": count.take()})
            report(record)
    finally:
        trainer.cleanup()
        trainer.mp_pool.terminate()
        import ray

        ray.shutdown()


SIDES = {"eslab": run_eslab, "reference": run_reference}


def run_side(args: argparse.Namespace, out: Path) -> int:
    """Run args.side, writing its record to `out` after every stage and its error, if any,
    last; 0 when it finished."""

    def report(record: dict) -> None:
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(record, indent=1))
        partial.replace(out)  # a reader never sees half a file

    record: dict = {}

    def keep(latest: dict) -> None:
        record.clear()
        record.update(latest)
        report(record)

    try:
        SIDES[args.side](args, Path(args.data), keep)
    except BaseException as exc:  # the error is the result: the parent reads it
        import traceback

        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
        report(record)
        traceback.print_exc()
        return 1
    return 0
