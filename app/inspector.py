"""What the sample inspector shows, as pure functions the pages call and tests check: which
samples a filter keeps, the LBES filters' funnel at one step, how a sample is named, and a
word diff of two completions rendered as inert Markdown."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.views import inert
from engine.lbes import FILTER_STAGES, filter_stage
from engine.sink import SampleRecord

BASE = "base"
"""The member filter's value for the unperturbed model's samples (member None)."""
KEPT, DROPPED = "kept", "dropped"

STAGE_LABELS = (
    "prompt-variance filter",
    "top/bottom-k",
    "same-reward prompts",
    "batch top/bottom-k",
)
"""A label for each of engine.lbes.FILTER_STAGES, in the same order."""
OTHER_FILTERS = "other filters"


@dataclass(frozen=True)
class SampleFilter:
    """What the inspector's filters ask for; the empty value of each field lets all through.

    member: BASE, or a member number as text. outcome: KEPT, DROPPED, or a filter name
    (dropped by that filter). reward: an inclusive (low, high) range. text: a
    case-insensitive search over prompt and completion."""

    member: str = ""
    outcome: str = ""
    reward: tuple[float, float] | None = None
    text: str = ""


def member_name(sample: SampleRecord) -> str:
    return BASE if sample.member is None else str(sample.member)


def _outcome_matches(sample: SampleRecord, outcome: str) -> bool:
    if outcome == KEPT:
        return sample.kept is True
    if outcome == DROPPED:
        return sample.kept is False
    return sample.dropped_by == outcome


def matches(sample: SampleRecord, wanted: SampleFilter) -> bool:
    if wanted.member and member_name(sample) != wanted.member:
        return False
    if wanted.outcome and not _outcome_matches(sample, wanted.outcome):
        return False
    if wanted.reward is not None:
        low, high = wanted.reward
        if sample.reward is None or not low <= sample.reward <= high:
            return False
    needle = wanted.text.strip().casefold()
    return (
        not needle or needle in sample.prompt.casefold() or needle in sample.completion.casefold()
    )


def filter_samples(samples: Sequence[SampleRecord], wanted: SampleFilter) -> list[SampleRecord]:
    return [s for s in samples if matches(s, wanted)]


def members(samples: Sequence[SampleRecord]) -> list[str]:
    """The member filter's choices at one step: base first, then members by number."""
    names = {member_name(s) for s in samples}
    return sorted(names, key=lambda n: (n != BASE, int(n) if n.isdigit() else -1))


def outcomes(samples: Sequence[SampleRecord]) -> list[str]:
    """The kept/dropped filter's choices: empty for samples no filter judged (ES, eval),
    else kept, dropped and each filter that dropped something, in the order they ran."""
    if all(s.kept is None for s in samples):
        return []
    names = {s.dropped_by for s in samples if s.dropped_by}
    return [KEPT, DROPPED, *sorted(names, key=_stage_order)]


def _stage_order(name: str) -> tuple[int, str]:
    stage = filter_stage(name)
    return (len(FILTER_STAGES) if stage is None else stage, name)


def stage_label(dropped_by: str) -> str:
    """A filter name for people: 'top/bottom-k (top_k_rewards+bottom_k_rewards)'."""
    stage = filter_stage(dropped_by)
    return f"{OTHER_FILTERS if stage is None else STAGE_LABELS[stage]} ({dropped_by})"


@dataclass(frozen=True)
class FunnelStage:
    label: str
    remaining: int
    dropped: int


def _configured(config: Mapping[str, Any], options: Sequence[str]) -> bool:
    return any(config.get(o) not in (None, False) for o in options)


def funnel(samples: Sequence[SampleRecord], config: Mapping[str, Any]) -> list[FunnelStage]:
    """The LBES filters at one step as a funnel: generated, then each filter the run
    configures (or that dropped something) with what it left, then kept. Empty when no
    sample was judged by the filters."""
    judged = [s for s in samples if s.kept is not None]
    if not judged:
        return []
    drops = [0] * (len(FILTER_STAGES) + 1)  # the last: names no filter of this code writes
    for s in judged:
        if s.kept is False and s.dropped_by:
            stage = filter_stage(s.dropped_by)
            drops[len(FILTER_STAGES) if stage is None else stage] += 1
    stages = [FunnelStage("generated", len(judged), 0)]
    remaining = len(judged)
    labels, options = (*STAGE_LABELS, OTHER_FILTERS), (*FILTER_STAGES, ())
    for i, (label, configures) in enumerate(zip(labels, options, strict=True)):
        if drops[i] or _configured(config, configures):
            remaining -= drops[i]
            stages.append(FunnelStage(label, remaining, drops[i]))
    stages.append(FunnelStage(KEPT, sum(s.kept is True for s in judged), 0))
    return stages


def sample_name(sample: SampleRecord) -> str:
    """A sample among its prompt's: member (or base) and sample number."""
    who = BASE if sample.member is None else f"member {sample.member}"
    return f"{who} · sample {sample.sample_index}"


def sample_title(sample: SampleRecord) -> str:
    """How a sample is named on its card: prompt, member (or base) and sample number."""
    return f"prompt {sample.prompt_index} · {sample_name(sample)}"


def verdict(sample: SampleRecord) -> str:
    """kept / dropped by which filter / '' for samples no filter judged."""
    if sample.kept is None:
        return ""
    if sample.kept:
        return KEPT
    return f"dropped by {stage_label(sample.dropped_by)}" if sample.dropped_by else DROPPED


_TOKENS = re.compile(r"\n+|[^\S\n]+|\S+")


def _words(text: str) -> list[str]:
    """Words and line breaks (runs of newlines count as one); other spaces separate."""
    return [
        "\n" if t[0] == "\n" else t for t in _TOKENS.findall(text) if not t.isspace() or "\n" in t
    ]


def word_diff(old: str, new: str) -> list[tuple[str, list[str]]]:
    """`old` -> `new` on words: (op, words) runs, op one of equal, delete, insert."""
    a, b = _words(old), _words(new)
    runs: list[tuple[str, list[str]]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            runs.append(("delete", a[i1:i2]))
        if op in ("insert", "replace"):
            runs.append(("insert", b[j1:j2]))
        if op == "equal":
            runs.append(("equal", a[i1:i2]))
    return runs


_MARKUP = {"equal": "{}", "delete": ":red-background[~~{}~~]", "insert": ":green-background[{}]"}


def diff_markdown(runs: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Runs of `word_diff` as Markdown: deleted words struck through on red, inserted ones
    on green, every word escaped by `inert` so that nothing a model wrote renders, and line
    breaks kept as hard breaks."""
    out: list[str] = []
    for op, words in runs:
        for line_no, line in enumerate(" ".join(words).split("\n")):
            if line_no:
                out.append("  \n")
            if line.strip():
                if out and not out[-1].endswith("\n"):
                    out.append(" ")
                out.append(_MARKUP[op].format(inert(line.strip())))
    return "".join(out).strip()
