"""Print the GPU benchmark table from the figures bench/gpu/utilization.py wrote (--json).

    python3 bench/gpu/table.py [FILE.json ...]    # default: bench/gpu/results/*.json

Columns: model size, mode (engines sharing the GPU, MPS when the CUDA MPS daemon ran, or the
low-rank mode with its rank: every member in one multi-LoRA call), step
time and its phases in seconds (generation and perturb are summed over members, so with
several engines they exceed the step), generated tokens per second of the iteration, and
utilization = that / tokens per second of one batched call of 256 prompts on one engine.
Below each table: the weight operations against one plain copy of all weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PHASES = ("generation", "perturb", "restore", "reward", "update")
BATCH = 256
STEP = "time/step"
TOKENS = "train/num_tokens"  # in these rows: completion tokens a step (older results too)
RESULTS = Path(__file__).resolve().parent / "results"


def print_table(r: dict) -> None:
    base = r.get("batched_tokens_per_s")
    size = f"{r.get('parameters', 0) / 1e6:.0f}M"
    batched = f"; one call of {BATCH} prompts: {base:,.0f} tokens/s" if base else ""
    print(
        f"\n{r['card']}: {r['model']} ({size} parameters), population {r['population']}, "
        f"{r['prompts']} prompts a member, {r['max_tokens']} tokens{batched}"
    )
    print(
        f"{'size':>6} {'mode':<19}{'step s':>8}{'gen s':>8}{'perturb':>8}{'restore':>8}"
        f"{'reward':>8}{'update':>8}{'tok/s':>9}{'util':>6}"
    )
    for row in r["rows"]:
        tps = row[TOKENS] / row[STEP]
        mode = row.get("mode") or (
            "1 engine" if row["engines"] == 1 else f"{row['engines']} engines/GPU"
        )
        mode += " MPS" if r.get("mps") and row["engines"] > 1 else ""
        phases = "".join(f"{row['time/' + p]:>8.2f}" for p in PHASES)
        util = f"{tps / base:>6.2f}" if base else ""
        print(f"{size:>6} {mode:<19}{row[STEP]:>8.2f}{phases}{tps:>9,.0f}{util}")
    ops = r.get("weight_ops_s")
    if ops:
        copy = ops["copy"]
        print(
            "weight operations (median ms, x one plain copy of all weights): "
            + ", ".join(f"{name} {s * 1e3:.2f} ({s / copy:.1f}x)" for name, s in ops.items())
        )


def main() -> None:
    files = [Path(a) for a in sys.argv[1:]] or sorted(RESULTS.glob("*.json"))
    for file in files:
        results = json.loads(file.read_text())
        print_table(results)
        if results.get("note"):
            print(f"({file.name}: {results['note']})")


if __name__ == "__main__":
    main()
