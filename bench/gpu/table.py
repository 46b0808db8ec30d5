"""The GPU benchmark tables, in Markdown, from the figures bench/gpu/utilization.py wrote
(--json).

    python3 bench/gpu/table.py [FILE.json ...]               # print them
    python3 bench/gpu/table.py --write docs/benchmarks.md    # regenerate them in the page

FILE defaults to bench/gpu/results/*.json. --write replaces the text between the page's
`<!-- gpu-table:start -->` and `<!-- gpu-table:end -->` lines and leaves the rest as it is.

One table a file, one row a measured configuration: the card, vLLM's version, the model
folder and its size, the mode (full-rank with the engines sharing the GPU, MPS when the CUDA
MPS daemon ran, or the low-rank mode with its rank: every member in one multi-LoRA call),
the step time and each phase the file holds in seconds (generation and perturb are summed
over members, so with several engines they exceed the step; in the low-rank mode perturb is
writing the members' adapter slots), generated tokens per second of the iteration, and
utilization = that / tokens per second of one batched call of 256 prompts on one engine, per
card (a row over several GPUs divides by their number: the share of its cards' batched
speed), and members per second (population / step time; newer files only).
Below each table: the weight operations against one plain copy of all weights. A figure a
file lacks (an older file) shows as '-'; rows and files of another kind are skipped with a
note.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doc_section import write_section

PHASES = ("generation", "perturb", "restore", "reward", "update")
PHASE_TITLES = {"perturb": "perturb / slot writing s"}
BATCH = 256
STEP = "time/step"
TOKENS = "train/num_tokens"  # in these rows: completion tokens a step (older results too)
RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]
SECTION = "gpu-table"
MISSING = "-"


def is_row(row: Any) -> bool:
    """A row of utilization.py: the engines it ran, its step time and tokens."""
    return isinstance(row, dict) and all(
        isinstance(row.get(k), int | float) for k in ("engines", STEP, TOKENS)
    )


def phases(rows: Sequence[dict]) -> list[str]:
    """The phases (time/NAME keys but the step) any row has: PHASES' order, then others."""
    found = {k.removeprefix("time/") for row in rows for k in row if k.startswith("time/")}
    found.discard(STEP.removeprefix("time/"))
    return [p for p in PHASES if p in found] + sorted(found - set(PHASES))


def in_slots(row: dict) -> bool:
    """A row of a population in adapter slots: the low-rank mode or full_batched."""
    return row.get("perturbation") in ("lora", "full_batched") or str(
        row.get("mode", "")
    ).startswith("lora")


def mode(results: dict, row: dict) -> str:
    """full, K engines (+ MPS), or a population in adapter slots: the low-rank mode and its
    rank ('lora r4, one call', or its engines where several split the population), or
    'full batched, one call'."""
    engines = row["engines"]
    if in_slots(row):
        calls = "one call" if engines == 1 else f"{engines} engines, 1 a GPU"
        return f"{row.get('mode') or 'lora'}, {calls}"
    per_gpu = row.get("engines_per_gpu", engines)
    if engines == 1:
        text = "full, 1 engine" + (" in a Ray actor" if row.get("in_actors") else "")
    elif per_gpu == 1:
        text = f"full, {engines} engines, 1 a GPU"
    else:
        text = f"full, {engines} engines/GPU"
    if (tp := results.get("tensor_parallel_size", 1)) > 1:
        text += f", TP {tp}"
    if threads := row.get("engine_threads"):
        text += f", {threads} threads each"
    return text + (" + MPS" if results.get("mps") and per_gpu > 1 else "")


def size(parameters: Any) -> str:
    if not isinstance(parameters, int | float) or parameters <= 0:
        return MISSING
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.0f}M"


def seconds(value: Any) -> str:
    """Two decimals, three under 0.1 s (a restore of a few ms is not nothing)."""
    if not isinstance(value, int | float):
        return MISSING
    return f"{value:.3f}" if 0 < value < 0.1 else f"{value:.2f}"


def source_name(file: Path) -> str:
    file = file.resolve()
    return str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else file.name


def render(results: Any, source: str) -> str:
    """One file's table, its caption (batched call, note) and its weight operations; a note
    alone for a file that is not utilization.py's, and one for each row it does not know."""
    rows = results.get("rows") if isinstance(results, dict) else None
    if not isinstance(rows, list):
        return f"(`{source}` skipped: not a bench/gpu/utilization.py result)"
    known = sorted(
        (r for r in rows if is_row(r)), key=lambda r: (in_slots(r), r["engines"])
    )  # a stable sort: one engine, several, then the low-rank mode
    base = results.get("batched_tokens_per_s")
    names = phases(known)
    caption = f"`{source}`"
    if isinstance(base, int | float):
        caption += f"; one call of {BATCH} prompts: {base:,.0f} tokens/s"
    if note := str(results.get("note") or ""):
        caption += f". {note[:1].upper()}{note[1:]}"
    header = [
        "card",
        "vLLM",
        "model",
        "mode",
        "step s",
        *(PHASE_TITLES.get(p, f"{p} s") for p in names),
        "tokens/s",
        "utilization",
        "members/s",
    ]
    lines = [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    folder = Path(str(results.get("model") or MISSING)).name
    model = f"{folder} ({size(results.get('parameters'))})"
    for row in known:
        tps = row[TOKENS] / row[STEP] if row[STEP] else None
        cards = row.get("gpus") or 1
        cells = [
            str(results.get("card") or MISSING),
            str(results.get("vllm") or MISSING),
            model,
            mode(results, row),
            seconds(row[STEP]),
            *(seconds(row.get(f"time/{p}")) for p in names),
            f"{tps:,.0f}" if tps else MISSING,
            f"{tps / base / cards:.2f}"
            if tps and isinstance(base, int | float) and base
            else MISSING,
            f"{row['members_per_s']:.1f}" if "members_per_s" in row else MISSING,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if skipped := len(rows) - len(known):
        lines += ["", f"({skipped} row(s) of another kind skipped)"]
    ops = results.get("weight_ops_s")
    if isinstance(ops, dict) and isinstance(ops.get("copy"), int | float) and ops["copy"] > 0:
        copy = ops["copy"]
        lines += [
            "",
            "Weight operations (median ms, x one plain copy of all weights): "
            + ", ".join(
                f"{name} {s * 1e3:.2f} ({s / copy:.1f}x)"
                for name, s in ops.items()
                if isinstance(s, int | float)
            )
            + ".",
        ]
    return "\n".join(lines)


def render_files(files: Sequence[Path]) -> str:
    """Every file's table, in the order given; a file that is not JSON is skipped with a note."""
    parts = []
    for file in files:
        try:
            results = json.loads(file.read_text())
        except ValueError as exc:
            parts.append(f"(`{source_name(file)}` skipped: not JSON: {exc})")
            continue
        parts.append(render(results, source_name(file)))
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: bench/gpu/results/*.json")
    parser.add_argument(
        "--write",
        type=Path,
        metavar="PAGE",
        help=f"replace the text between the page's {SECTION}:start and :end marker comments",
    )
    args = parser.parse_args(argv)
    text = render_files(args.files or sorted(RESULTS.glob("*.json")))
    if args.write is None:
        print(text)
        return 0
    try:
        changed = write_section(args.write, SECTION, text)
    except (OSError, ValueError) as exc:
        print(f"table.py: {exc}", file=sys.stderr)
        return 2
    print(f"{args.write}: GPU tables {'regenerated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
