"""Cost of the weight operations of the perturbation engine against one plain weight copy.

    .venv/bin/python bench/perturb.py [--model DIR] [--repeats 10] [--members 8 32] [--cpu-bind 1]
        [--tensor-parallel-size 2]

Starts one VLLMEngine (as the trainer does: engine core in this process) and prints, in
milliseconds, the fastest and median of `repeats` timings of:
- copy: one plain copy of all serving weights into a spare buffer (inside the worker; with
  tensor_parallel_size > 1 every rank copies its shard at the same time, and the slowest
  rank's time counts, as it does for the weight operations);
- perturb: weights := snapshot + scale * eps(seed), a new seed each time; also timed
  inside the worker (the kernels alone, without the call to the worker, which with
  tensor_parallel_size > 1 goes to another process);
- restore: weights := snapshot;
- update N: master += sum of N members' coefficient * eps in fp32, then serving := cast;
- checksum: sha256 of serving weights and fp32 master;
and the ratios (perturb + restore) / copy and perturb / copy. EnginePool.evaluate restores
once per engine after its last member (perturb rewrites every weight from the snapshot), so
its per-member overhead is the perturb alone. Timings are taken in the calling process
(collective_rpc and the prefix-cache reset included), as the trainer sees them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[int], object], repeats: int) -> list[float]:
    """Seconds of fn(i) for i in range(repeats), after one warm-up call."""
    fn(-1)
    out = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def row(name: str, seconds: list[float], copy_s: float) -> str:
    best, median = min(seconds), statistics.median(seconds)
    return f"{name:<24}{best * 1e3:>10.1f}{median * 1e3:>10.1f}{best / copy_s:>10.2f}"


def main() -> None:
    from engine.backends.vllm.engine import VLLMEngine
    from engine.paths import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_dir()))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--members", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="default: the engine's (0.9 on a GPU, a KV cache of fixed size on the CPU)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks of the engine; the default model's 9 heads need 1 (bench/gpu/"
        "make_models.py builds smollm2-135m-8heads-random for 2)",
    )
    parser.add_argument(
        "--cpu-bind",
        help="VLLM_CPU_OMP_THREADS_BIND for the engine (e.g. 1: one thread pinned to core 1, "
        "steadier than 2 threads when other processes share the cores); default: nobind",
    )
    args = parser.parse_args()
    if args.cpu_bind:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cpu_bind

    engine = VLLMEngine(
        args.model,
        max_model_len=1024,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    info = engine.info
    print(
        f"model {args.model}: {info['num_parameters'] / 1e6:.1f}M parameters in "
        f"{info['num_tensors']} tensors ({info['packed_tensors']} stored packed) on rank 0 of "
        f"{info['tp_size']}, device {info['device']}, {info['torch_threads']} torch threads, "
        f"noise table {info['table_len']:,} x {info['table_dtype']}, ES state built in "
        f"{info['seconds']:.1f} s"
    )
    rng = random.Random(0)
    per_rank = engine.llm.collective_rpc("es_time_copy", args=(args.repeats,))
    copy_runs = max(per_rank, key=min)  # the slowest rank's
    copy_s = min(copy_runs)

    perturb = timed(lambda i: engine.perturb(10_000 + i, 0.002), args.repeats)
    in_worker = max(engine.llm.collective_rpc("es_time_perturb", args=(args.repeats,)), key=min)
    restore = timed(lambda i: engine.restore(), args.repeats)

    def cycle(i: int) -> None:
        engine.perturb(20_000 + i, 0.002)
        engine.restore()

    cycles = timed(cycle, args.repeats)
    updates = {}
    for n in args.members:

        def update(i: int, n: int = n) -> None:
            seeds = [rng.randrange(2**31) for _ in range(n)]
            engine.update(seeds, [rng.gauss(0.0, 1e-5) for _ in range(n)])

        updates[n] = timed(update, max(2, args.repeats // 4))
    checksum = timed(lambda i: engine.checksum(), 3)

    print(f"\n{'operation':<24}{'best ms':>10}{'median ms':>10}{'x copy':>10}")
    print(row("copy (all weights)", copy_runs, copy_s))
    print(row("perturb", perturb, copy_s))
    print(row("  in the worker", in_worker, copy_s))
    print(row("restore", restore, copy_s))
    print(row("perturb + restore", cycles, copy_s))
    for n, seconds in updates.items():
        print(row(f"update N={n}", seconds, copy_s))
        print(row(f"  per member (N={n})", [t / n for t in seconds], copy_s))
    print(row("checksum", checksum, copy_s))
    print(
        f"\n(perturb + restore) / copy = {min(cycles) / copy_s:.2f} (best), "
        f"{statistics.median(cycles) / statistics.median(copy_runs):.2f} (median)"
    )
    print(
        f"per member in EnginePool.evaluate (perturb only) / copy = {min(perturb) / copy_s:.2f}"
        f" ({min(in_worker) / copy_s:.2f} inside the worker)"
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
