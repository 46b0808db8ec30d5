"""Conciseness reward: minus the length difference, in characters, to a target answer.

The conciseness task of VsonicV/es-fine-tuning-paper (arXiv 2509.24372,
`es_fine-tuning_conciseness.py`): R = -|len(y) - len(s)|. Unlike that code, which measured the
decoded prompt + completion, ES Lab scores the completion only (docs/design.md, "Engine
rules").
The paper reports 1 + R / 2000 to map rewards onto [0, 1]; that is a display choice and not
applied here.
"""

from __future__ import annotations

OPTIMUM = 0.0
"""The best reward there is: an answer exactly as long as the target. What a preset's curve is
measured against (bench/preset_curves.py: how much closer to it training got)."""


def compute_score(completion_text: str, *, target: str) -> dict:
    """Score one completion: {"reward": -|len(completion) - len(target)|, "length":
    len(completion)}; the length part tells too long from too short."""
    length = len(completion_text)
    return {"reward": -float(abs(length - len(target))), "length": float(length)}
