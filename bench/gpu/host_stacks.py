"""Where a step's host time goes, from a sampler's stacks: py-spy's raw (collapsed) output of a
run, only the stacks inside the step, by function, inclusive and self.

    py-spy record --nonblocking -r 250 -f raw -o stacks.txt -- \\
        python3 bench/gpu/profile_step.py MODEL --lora --out DIR --steps-only 10
    python3 bench/gpu/host_stacks.py stacks.txt [--within REGEX] [--top 40] [--calls N]

A sampler costs the sampled process almost nothing, unlike cProfile, whose per-call cost
doubled the host-bound step it measured. Engine start-up and shutdown fall outside the
default window (frames of profile_step.py's one_step). With --calls (how many times the window
was entered: profile_step.py's warm-up and plain steps count) the shares are also given in
seconds a call, at py-spy's rate --rate, so that two runs (a LoRA step and the plain
256-prompt call, say) compare function by function.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r":\d+\)$")


def read_stacks(text: str) -> list[tuple[list[str], int]]:
    """(frames outermost first, samples) of each line `f1;f2;...;fn COUNT`."""
    stacks = []
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def function(frame: str) -> str:
    """A frame without its line: every line of a function counts as the function."""
    return LINE.sub(")", frame)


def shares(
    stacks: list[tuple[list[str], int]], within: re.Pattern[str]
) -> tuple[int, Counter[str], Counter[str]]:
    """Samples inside the window, and the samples of each function in them: inclusive (on
    the stack at all, once a sample however deep its recursion) and self (the leaf)."""
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for frames, n in stacks:
        if not any(within.search(f) for f in frames):
            continue
        total += n
        for name in {function(f) for f in frames}:
            inclusive[name] += n
        own[function(frames[-1])] += n
    return total, inclusive, own


def report(
    total: int, inclusive: Counter[str], own: Counter[str], top: int, seconds_per_sample: float = 0
) -> list[str]:
    """Shares of the window's samples; with seconds_per_sample (1 / rate / calls) also
    seconds a call."""
    if not total:
        return ["no sample inside the window"]

    def row(n: int, name: str) -> str:
        seconds = f"{n * seconds_per_sample:8.3f} s" if seconds_per_sample else ""
        return f"  {n / total:6.1%}{seconds}  {name}"

    head = f"{total} samples inside the window"
    if seconds_per_sample:
        head += f", {total * seconds_per_sample:.3f} s a call"
    lines = [head, "inclusive:"]
    lines += [row(n, name) for name, n in inclusive.most_common(top)]
    lines.append("self:")
    lines += [row(n, name) for name, n in own.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks", type=Path, help="py-spy record -f raw output")
    parser.add_argument("--within", default=r"^one_step \(", help="frames that open the window")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--calls", type=int, help="times the window was entered")
    parser.add_argument("--rate", type=float, default=250.0, help="py-spy's samples a second")
    args = parser.parse_args()
    stacks = read_stacks(args.stacks.read_text())
    per_sample = 1 / args.rate / args.calls if args.calls else 0
    print("\n".join(report(*shares(stacks, re.compile(args.within)), args.top, per_sample)))


if __name__ == "__main__":
    main()
