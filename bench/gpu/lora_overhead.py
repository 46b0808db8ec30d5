"""What the low-rank mode's step costs beyond a plain call of the same tokens, part by part.

    python3 bench/gpu/lora_overhead.py MODEL [--rounds 3] [--population 32] [--prompts 8]
        [--max-tokens 128] [--json FILE]

utilization.py sets the low-rank step against one 256-prompt call on the unperturbed model;
the gap between the two mixes four things, which this script takes apart on ONE multi-LoRA
engine (one start), in interleaved rounds so that the machine's drift falls on every part
alike:

- `reference`: utilization.py's reference call (the task's prompts repeated to 256, no
  adapter): repeated prompts share their prefix blocks in vLLM's cache;
- `member prompts`: the step's own 256 prompts (its `prompts` prompts once per member), each
  member's under a cache salt of its own, no adapter: what the prompts and the cache alone
  change;
- `adapters`: the same call with every member's prompts on its own adapter slot (the slots
  the warm-up step wrote): what serving 32 adapters costs in vLLM (its LoRA kernels on the
  card, its per-step LoRA bookkeeping on the host);
- `step`: a whole low-rank ES step (slot writing, that call, scoring, the merged update).

Every part is timed with the GPU synchronized at both ends and prints tokens/s and its time
against the reference's; the step's own phases (the trainer's clock) come with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utilization import (
    ONE_ENGINE,
    TRAIN_FILE,
    add_run_arguments,
    batch_prompts,
    common_options,
    es_config,
    lora_pool,
    plain_call,
)

from engine import metrics as mk
from engine.data.datasets import load_dataset
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

PARTS = ("reference", "member prompts", "adapters", "step")


def summary(times: dict[str, list[float]], tokens: dict[str, list[int]]) -> dict[str, dict]:
    """Per part: every round's seconds and tokens, the median seconds and tokens/s, and the
    median seconds against the reference's (a part slower than the reference is above 1)."""
    base = statistics.median(times["reference"])
    rows = {}
    for part, seconds in times.items():
        rates = [n / s for n, s in zip(tokens[part], seconds, strict=True)]
        rows[part] = {
            "seconds": seconds,
            "tokens": tokens[part],
            "median_s": statistics.median(seconds),
            "tokens_per_s": statistics.median(rates),
            "x_reference": statistics.median(seconds) / base,
        }
    return rows


def rounds_arguments(description: str) -> argparse.Namespace:
    """The arguments of a script that times parts in interleaved rounds on one engine: the
    measured run's (add_run_arguments), --rounds and --json."""
    parser = argparse.ArgumentParser(description=description)
    add_run_arguments(parser)
    parser.set_defaults(**ONE_ENGINE)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> None:
    args = rounds_arguments(__doc__.split("\n\n")[0])
    pool = lora_pool(args, common_options(args))
    engine = pool._local
    config = es_config(args, "lora")
    reference = batch_prompts()
    task = [e.prompt for e in load_dataset(TRAIN_FILE)][: args.prompts]
    members = range(args.population)
    member_prompts = [p for _ in members for p in task]
    member_salts = [f"{engine._salt}-m{m}" for m in members for _ in task]
    slots = [m for m in members for _ in task]
    times: dict[str, list[float]] = {p: [] for p in PARTS}
    tokens: dict[str, list[int]] = {p: [] for p in PARTS}
    phases: list[dict] = []
    try:
        train(config, MemorySink(), pool=pool)  # warm-up: builds the kernels, writes the slots
        for _ in range(args.rounds):
            for part, prompts, salts, adapters in (
                ("reference", reference, [engine._salt] * len(reference), None),
                ("member prompts", member_prompts, member_salts, None),
                ("adapters", member_prompts, member_salts, slots),
            ):
                seconds, n = plain_call(engine, prompts, args.max_tokens, salts, adapters)
                times[part].append(seconds)
                tokens[part].append(n)
            sink = MemorySink()
            train(config, sink, pool=pool)
            step = sink.steps[0]
            times["step"].append(step.metrics[mk.time_key("step")])
            tokens["step"].append(int(completion_tokens(step)))
            phases.append({k: v for k, v in step.metrics.items() if k.startswith("time/")})
    finally:
        pool.shutdown()
    rows = summary(times, tokens)
    print(
        f"{args.model}: population {args.population} x {args.prompts} prompts, "
        f"{args.max_tokens} tokens, rank {args.rank}, {args.rounds} rounds (median)"
    )
    for part, row in rows.items():
        print(
            f"  {part:15s} {row['median_s']:7.3f} s  {row['tokens_per_s']:9,.0f} tokens/s"
            f"  x{row['x_reference']:5.2f}"
        )
    print(
        "  step phases:", {k: round(statistics.median(p[k] for p in phases), 4) for k in phases[0]}
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "rows": rows,
                    "phases": phases,
                    "command": " ".join(sys.argv),
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
