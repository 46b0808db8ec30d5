"""How long a run waits for its engine on the CPU, by part, and the memory the engine holds.

    .venv/bin/python bench/engine_start.py [--repeats 2] [--model DIR]

Each start runs in a fresh process (as a run's worker does): as ES Lab starts an engine (the
KV cache it sizes, ESLAB_CPU_KV_CACHE_GIB, 2 GiB by default, and the objects that exist frozen
for the garbage collector while vLLM starts), the same without that freeze, and with vLLM's
own CPU sizing of the KV cache (a share of RAM: `gpu_memory_utilization` 0.3). Per start it
prints: importing vLLM, creating
the engine (model, weights, KV cache), the ES state on the worker (master, snapshot, noise
table), the first generated token, and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def one_start(model: str, share: float | None, freeze: bool) -> dict[str, float]:
    """Runs in the child: one engine start, timed by part."""
    import gc
    import resource

    if not freeze:  # the engine's gc.freeze() / gc.unfreeze() become no-ops
        gc.freeze = gc.unfreeze = lambda: None

    start = time.perf_counter()
    import vllm  # noqa: F401

    imported = time.perf_counter()
    from engine.backends.vllm.engine import VLLMEngine

    engine = VLLMEngine(model, max_model_len=1024, gpu_memory_utilization=share)
    created = time.perf_counter()
    engine.generate(["Hello"], max_tokens=1)
    first = time.perf_counter()
    es_s = float(engine.info["seconds"])
    return {
        "import vllm": imported - start,
        "engine (model, weights, KV cache)": created - imported - es_s,
        "ES state (master, snapshot, noise)": es_s,
        "first token": first - created,
        "total": first - start,
        "peak RSS GiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    from engine.paths import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_dir()))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        share = None if args.child.startswith("eslab") else float(args.child)
        result = one_start(args.model, share, freeze=args.child != "eslab-no-freeze")
        print("RESULT " + json.dumps(result), flush=True)
        return
    print("command: .venv/bin/python " + shlex.join(sys.argv), flush=True)
    sizings = {
        "ES Lab": "eslab",
        "without gc.freeze": "eslab-no-freeze",
        "vLLM's KV cache sizing": "0.3",
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sizings}
    for _ in range(args.repeats):
        for name, child in sizings.items():  # alternated, so drift hits both alike
            out = subprocess.run(
                [sys.executable, __file__, "--model", args.model, "--child", child],
                cwd=PROJECT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))
            results[name].append(json.loads(line.removeprefix("RESULT ")))
            print(f"{name}: {results[name][-1]['total']:.1f} s", flush=True)
    parts = list(next(iter(results.values()))[0])
    print(f"\nmedian of {args.repeats} starts, seconds unless said")
    print(f"{'part':<36}" + "".join(f"{name:>24}" for name in results))
    for part in parts:
        cells = "".join(
            f"{statistics.median(r[part] for r in runs):>24.2f}" for runs in results.values()
        )
        print(f"{part:<36}{cells}")


if __name__ == "__main__":
    main()
