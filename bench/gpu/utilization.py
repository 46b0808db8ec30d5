"""Engine utilization of an ES iteration on a GPU, with one or several engines per GPU.

    python3 bench/gpu/utilization.py MODEL_DIR [--engines 1 4 8] [--lora] [--batched]
        [--population 32]
        [--prompts 8] [--max-tokens 128] [--steps 1] [--lora-kernels fast] [--json FILE]
        [--engines-per-gpu 1] [--tensor-parallel-size 2]

utilization = generated tokens per second of an ES iteration (population members, each
generating for `prompts` prompts, greedy) / tokens per second of ONE batched generate call of
256 prompts on one engine of the unperturbed model (what the engine can do when its batch is
full). With one engine, members run one at a time and its batch holds only `prompts`
sequences; with K engines sharing the GPU (EnginePool engines_per_gpu=K, Ray actors) K members
generate at once. `--engines-per-gpu 1` spreads the K engines over K GPUs instead (one card
each), and `--tensor-parallel-size T` splits every engine over T GPUs. Each row also gives
members per second (population / step time), the figure that several GPUs should multiply.
With --lora, a last row runs the low-rank mode (perturbation: lora, rank
--rank, merged updates) on one multi-LoRA engine: every member's prompts in one call, one
adapter per member (`--engines` with no count: that row alone, the 256-prompt call then on
the multi-LoRA engine). With --batched, a row runs perturbation full_batched the same way:
full-rank members in the adapter slots, each layer adding every member's noise product. A
random-weight model generates until max_tokens almost always, so every
member does the same work.

Also prints the weight operations against one plain copy of all weights (inside the worker,
synchronized): perturb, restore and an update of `population` members. Prints one table row
per engine count and writes every figure to --json, with the card, vLLM's version and each
row's perturbation (full or lora), which bench/gpu/table.py shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from engine import metrics as mk
from engine.backends.arrangement import card_here, choose, engine_memory, vllm_takes_kv_cache_size
from engine.backends.pool import EnginePool, gpu_engine_threads
from engine.config import RunConfig
from engine.config.schema import AUTO
from engine.data.datasets import load_dataset
from engine.lowrank.factors import LORA_KERNELS
from engine.paths import data_dir, resolve_path
from engine.sink import MemorySink
from engine.slot_population import slot_engine_args
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import engine_count
from table import BATCH, PHASES, TOKENS, render

TRAIN_FILE = resolve_path("data/conciseness/train.parquet")


def batch_prompts(count: int = BATCH) -> list:
    """The `count` prompts of the reference call: the task's prompts, repeated."""
    prompts = [e.prompt for e in load_dataset(TRAIN_FILE)]
    return [prompts[i % len(prompts)] for i in range(count)]


REFERENCE_CALLS = 3
"""Timed reference calls, of which the median counts. At 1.07B the call is bound by the host
(the GPU busy 20-31% of it), and one call's rate moved by a third between runs minutes apart
on one machine (bench/gpu/results/h200-1b-lora-targets*.json): every call is kept in the
JSON, so a file shows its own spread."""


def plain_call(
    engine, prompts: list, max_tokens: int, salts: list[str] | None = None, adapters=None
) -> tuple[float, int]:
    """(seconds, generated tokens) of one `vllm.LLM.generate` call as a user of vLLM makes it
    (`timed_generate`)."""
    seconds, outputs = timed_generate(engine, prompts, max_tokens, salts, adapters)
    return seconds, sum(len(o.token_ids) for out in outputs for o in out.outputs)


def timed_generate(
    engine, prompts: list, max_tokens: int, salts: list[str] | None = None, adapters=None
) -> tuple[float, list]:
    """(seconds, vLLM's outputs) of one `vllm.LLM.generate` call as a user of vLLM makes it,
    greedy, the GPU synchronized at both ends: vLLM's own detokenizer, not ES Lab's batch
    decode (engine/backends/vllm/detokenize.py), so that the reference is plain vLLM's rate.
    Every prompt carries its cache salt (default: the engine's current one)."""
    from vllm import SamplingParams

    from engine.backends.vllm.lora_slots import lora_requests

    params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, seed=0)
    salts = salts or [engine._salt] * len(prompts)
    requests = [
        {"prompt_token_ids": engine.prompt_token_ids(p), "cache_salt": s}
        for p, s in zip(prompts, salts, strict=True)
    ]
    extra = {}
    if adapters is not None:
        extra["lora_request"] = lora_requests(engine, adapters, engine._member_placeholder)
    engine.check("es_check_synchronize")
    start = time.perf_counter()
    outputs = engine.llm.generate(requests, params, use_tqdm=False, **extra)
    engine.check("es_check_synchronize")
    return time.perf_counter() - start, outputs


def batched_tokens_per_s(pool: EnginePool, max_tokens: int, results: dict) -> float:
    """Median tokens/s of REFERENCE_CALLS plain calls of BATCH prompts on the pool's own
    engine (after one untimed warm-up call); each call's rate goes to
    results["batched_calls_tokens_per_s"]."""
    batch = batch_prompts()
    plain_call(pool._local, batch, 8)  # warm-up at the full batch: kernels built for its sizes
    rates = []
    for _ in range(REFERENCE_CALLS):
        seconds, tokens = plain_call(pool._local, batch, max_tokens)
        rates.append(tokens / seconds)
    results["batched_calls_tokens_per_s"] = rates
    return statistics.median(rates)


CONCISENESS = {
    "train_file": str(TRAIN_FILE),
    "reward_func_path": "engine.rewards.conciseness.compute_score",
}
"""The task of this benchmark's ES rows: its prompts and their reward."""


def es_config(
    args: argparse.Namespace, perturbation: str = "full", task: dict[str, str] = CONCISENESS
) -> RunConfig:
    """The measured run in `perturbation` mode (full, lora or full_batched): `task` gives
    train_file and reward_func_path (and prompt_format where the prompts are raw text)."""
    options = {
        "method": "es",
        "model": args.model,
        "output_dir": str(data_dir() / "runs" / "bench-gpu"),
        **task,
        "population_size": args.population,
        "data_batch_size": args.prompts,
        "max_steps": args.steps + 1,
        "max_tokens": args.max_tokens,
        "noise_std": 0.002,
        "learning_rate": 1e-5,
        "antithetic": args.antithetic,
    }
    options["perturbation"] = perturbation
    if perturbation == "lora":
        options |= {
            "perturbation": "lora",
            "lora_rank": args.rank,
            "lora_kernels": args.lora_kernels,
            "noise_std": 0.02,
        }
    return RunConfig.from_flat(options)


def es_iteration(pool: EnginePool, config: RunConfig) -> dict[str, float]:
    """Mean metrics of the measured ES steps (the first step is a warm-up)."""
    sink = MemorySink()
    train(config, sink, pool=pool)
    measured = [s.metrics for s in sink.steps[1:]]
    keys = [mk.time_key("step"), *(mk.time_key(p) for p in PHASES)]
    means = {k: float(np.mean([m.get(k, 0.0) for m in measured])) for k in keys}
    generated = [completion_tokens(s) for s in sink.steps[1:]]  # the table's tokens column
    return {**means, TOKENS: float(np.mean(generated))}


def weight_ops(pool: EnginePool, population: int, repeats: int = 10) -> dict[str, float]:
    """Median seconds of copy, perturb, restore, update(population), each synchronized."""
    engine = pool._local
    assert engine is not None, "weight_ops needs a pool of one engine"

    def timed(fn, n: int = repeats) -> float:
        fn(-1)
        engine.check("es_check_synchronize")
        out = []
        for i in range(repeats):
            start = time.perf_counter()
            fn(i)
            engine.check("es_check_synchronize")
            out.append(time.perf_counter() - start)
        return statistics.median(out)

    copy = statistics.median(engine.llm.collective_rpc("es_time_copy", args=(repeats,))[0])
    rng = np.random.default_rng(0)
    ops = {
        "copy": copy,
        "perturb": timed(lambda i: engine.perturb(50_000 + i, 0.002)),
        "restore": timed(lambda i: engine.restore()),
        f"update_{population}": timed(
            lambda i: engine.update(
                [int(s) for s in rng.integers(0, 2**31, population)],
                [float(c) for c in rng.normal(0.0, 1e-6, population)],
            )
        ),
        # the pool checks engines agree after every update: part of the trainer's update phase
        "checksum": timed(lambda i: engine.checksum(), 3),
    }
    # the same operations timed inside the worker: the kernels without the call into vLLM's
    # engine (which costs more under MPS)
    inside = {
        "perturb": ("es_time_perturb", (repeats,)),
        "restore": ("es_time_restore", (repeats,)),
        f"update_{population}": ("es_time_update", (population, repeats)),
    }
    for name, (method, method_args) in inside.items():
        ops[f"{name} in worker"] = statistics.median(
            engine.llm.collective_rpc(method, args=method_args)[0]
        )
    # the update's floor: the members' noise read once (CUDA kernels; the offsets are hashed
    # before the clock starts, as the update hashes them before its kernel)
    floor = engine.llm.collective_rpc("es_time_noise_floor", args=(population, repeats))[0]
    if floor:
        ops[f"noise_{population}"] = statistics.median(floor)
    return ops


def engines_per_gpu(args: argparse.Namespace, k: int) -> int:
    """Engines of a row of k that share one GPU (--engines-per-gpu; all k when unset)."""
    return min(k, args.engines_per_gpu or k)


def row_order(k: int | str) -> float:
    """Rows of Ray-actor engines first (auto's, then the most), the in-process one last."""
    return float("inf") if k == AUTO else float(k)


def common_options(args: argparse.Namespace) -> dict:
    """Engine options every row shares: context length, seed and tensor parallelism."""
    common = {"max_model_len": args.max_model_len, "seed": 0}
    if args.tensor_parallel_size > 1:
        common["tensor_parallel_size"] = args.tensor_parallel_size
    return common


def full_rank_pool(
    args: argparse.Namespace, k: int | str, common: dict, in_actors: bool = False
) -> EnginePool:
    """The k full-rank engines of a row (args: model, prompts, memory, engines_per_gpu); k
    auto: the engines a run gets by default (`auto_pool`). One engine runs in this process
    unless `in_actors` (the --actor-row: one engine as each engine of several runs)."""
    if k == AUTO:
        return auto_pool(args, common)
    # an engine of several only ever holds one member's prompts: fewer CUDA graphs
    seqs = BATCH if k == 1 and not in_actors else 4 * args.prompts
    per_gpu = engines_per_gpu(args, k)
    # an in-process engine does not give all its memory back at shutdown: leave room
    # (the --lora row starts a second one after it)
    return EnginePool(
        args.model,
        num_engines=k,
        engines_per_gpu=per_gpu,
        in_actors=in_actors,
        max_num_seqs=seqs,
        gpu_memory_utilization=args.memory / per_gpu,
        **common,
    )


def actor_threads(num_engines: int) -> int:
    """The OpenMP threads each engine in a Ray actor was given (engine/backends/pool.py)."""
    return int(gpu_engine_threads(num_engines)["OMP_NUM_THREADS"])


def auto_pool(args: argparse.Namespace, common: dict) -> EnginePool:
    """The engines `num_engines: auto` starts for a run of this row's settings on this
    machine's first card (engine/backends/arrangement.py), in Ray actors as in a Ray job,
    with vLLM's default max_num_seqs as a run has it; --memory is the card's share for all
    of them. Prints what auto chose."""
    memory = engine_memory(
        args.model,
        dtype="bfloat16",
        max_model_len=args.max_model_len,
        max_num_seqs=None,
        sequences=args.prompts,
        max_tokens=args.max_tokens,
    )
    chosen = choose(
        card_here(),
        memory,
        population=args.population,
        in_actors=True,
        card_share=args.memory,
        sized_kv_cache=vllm_takes_kv_cache_size(),
    )
    print(*chosen.notes, sep="\n", flush=True)
    return EnginePool(
        args.model,
        num_engines=chosen.num_engines,
        engines_per_gpu=chosen.engines_per_gpu,
        in_actors=True,
        one_node=chosen.one_node,
        gpu_memory_utilization=chosen.gpu_memory_utilization or args.memory,
        extra_llm_args=chosen.engine_args(),
        **common,
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The measured run's arguments, which every bench/gpu script of an ES step shares: the
    model, the population and its prompts, the token budget, the low-rank mode's rank and
    kernels, and the engines' context length and share of the GPU's memory."""
    parser.add_argument("model")
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=4, help="lora_rank of the low-rank mode")
    parser.add_argument(
        "--antithetic",
        action="store_true",
        help="members in +eps/-eps pairs (full_batched's kernel then reads a pair's noise once)",
    )
    parser.add_argument(
        "--lora-kernels",
        default="deterministic",
        choices=LORA_KERNELS,
        help="lora_kernels of the low-rank mode (a process reads vLLM's kernel choice once)",
    )
    parser.add_argument(
        "--memory",
        type=float,
        default=0.4,
        help="share of the GPU's memory for all engines of a row together",
    )


ONE_ENGINE = {"steps": 0, "tensor_parallel_size": 1, "engines_per_gpu": 1}
"""What es_config and common_options read that a script of one in-process engine does not
ask for (parser.set_defaults)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser)
    parser.add_argument(
        "--engines",
        type=engine_count,
        nargs="*",
        default=[1, 4],
        help="full-rank rows, one per engine count or auto (the engines a run gets by "
        "default); none (--engines alone) for --lora only",
    )
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument(
        "--actor-row",
        action="store_true",
        help="add a row of one full-rank engine in a Ray actor (as each engine of several "
        "runs), beside the in-process one",
    )
    parser.add_argument("--lora", action="store_true", help="add the low-rank mode's rows")
    parser.add_argument(
        "--batched",
        action="store_true",
        help="add perturbation full_batched's rows (full-rank members in adapter slots, one "
        "call), one per --lora-engines count",
    )
    parser.add_argument(
        "--lora-engines",
        type=int,
        nargs="+",
        default=[1],
        help="--lora rows, one per engine count, one engine a GPU (the population split over them)",
    )
    parser.add_argument(
        "--engines-per-gpu",
        type=int,
        default=0,
        help="engines sharing one GPU (default: all of a row's engines on one GPU)",
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs each engine is split over"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch
    import vllm

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    results = {
        "model": args.model,
        "card": card,
        "vllm": vllm.__version__,
        "population": args.population,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "antithetic": args.antithetic,
        "rows": [],
    }
    common = common_options(args)
    # engines in Ray actors free their memory when killed; an in-process engine does not, so
    # the one-engine row (which also measures the 256-prompt call) runs last
    tp = args.tensor_parallel_size
    if tp > 1:
        results["tensor_parallel_size"] = tp
    rows = [(k, False) for k in sorted(args.engines, key=row_order, reverse=True)]
    if args.actor_row:
        rows.insert(len(rows) - (1 in args.engines), (1, True))
    for k, in_actors in rows:
        start = time.perf_counter()
        pool = full_rank_pool(args, k, common, in_actors)
        started = time.perf_counter() - start
        # auto puts its engines on one card
        per_gpu = pool.num_engines if k == AUTO else engines_per_gpu(args, k)
        local = pool._local is not None
        try:
            if local:
                info = pool._local.info
                results["parameters"] = info["num_parameters"]
                results["packed_tensors"] = info["packed_tensors"]
                results["batched_tokens_per_s"] = batched_tokens_per_s(
                    pool, args.max_tokens, results
                )
            row = {
                "engines": pool.num_engines,
                "engines_per_gpu": per_gpu,
                "gpus": pool.num_engines * tp // per_gpu,
                "places": pool.devices(),
                "in_actors": not local,
                **({} if local else {"engine_threads": actor_threads(pool.num_engines)}),
                "perturbation": "full",
                "start_s": started,
                **es_iteration(pool, es_config(args)),
            }
            row["members_per_s"] = args.population / row[mk.time_key("step")]
            if local:
                results["weight_ops_s"] = weight_ops(pool, args.population)
        finally:
            pool.shutdown()
        record(results, row, args.json)
    slot_modes = {"lora": args.lora, "full_batched": args.batched}
    for perturbation in [p for p, wanted in slot_modes.items() if wanted]:
        # engines in actors first: the in-process one keeps some memory after shutdown
        for k in sorted(args.lora_engines, reverse=True):
            record(results, slot_row(args, common, results, perturbation, k), args.json)
    print(render(results, str(args.json or args.model)))


def lora_pool(
    args: argparse.Namespace, common: dict, k: int = 1, perturbation: str = "lora"
) -> EnginePool:
    """k multi-LoRA engines (max_loras = the population), one a GPU, for a population in
    adapter slots (`perturbation` lora or full_batched); one runs in this process."""
    return EnginePool(
        args.model,
        num_engines=k,
        max_num_seqs=BATCH,
        gpu_memory_utilization=args.memory,
        extra_llm_args=slot_engine_args(es_config(args, perturbation)),
        lora_kernels=args.lora_kernels,
        **common,
    )


def slot_row(
    args: argparse.Namespace, common: dict, results: dict, perturbation: str, k: int = 1
) -> dict:
    """A population in adapter slots (the low-rank mode, or full_batched's full-rank
    members) on k multi-LoRA engines, the population's prompts split over them. Without a
    one-engine full-rank row, the 256-prompt call is measured on this row's first engine
    (the base model, no adapter): the engine's own batched speed."""
    start = time.perf_counter()
    pool = lora_pool(args, common, k, perturbation)
    started = time.perf_counter() - start
    try:
        if "batched_tokens_per_s" not in results and k == 1:
            results["parameters"] = pool._local.info["num_parameters"]
            results["batched_tokens_per_s"] = batched_tokens_per_s(pool, args.max_tokens, results)
            results["note"] = "the 256-prompt call ran on the multi-LoRA engine"
        row = {
            "engines": k,
            "engines_per_gpu": 1,
            "gpus": k * args.tensor_parallel_size,
            "places": pool.devices(),
            "perturbation": perturbation,
            "mode": (
                f"lora r{args.rank}, {args.lora_kernels} kernels"
                if perturbation == "lora"
                else "full batched" + (", antithetic" if args.antithetic else "")
            ),
            "start_s": started,
            **es_iteration(pool, es_config(args, perturbation)),
        }
        row["members_per_s"] = args.population / row[mk.time_key("step")]
        return row
    finally:
        pool.shutdown()


def record(results: dict, row: dict, json_file: Path | None) -> None:
    results["rows"].append(row)
    print(json.dumps(row), flush=True)
    if json_file:  # after every row: a run cut short keeps what it measured
        json_file.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
