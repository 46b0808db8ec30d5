"""ES at Scale's math prompt layout (VsonicV/es-at-scale,
es_at_scale/template_function/apply_template.py, `qwen_math_template`) as ES Lab's own
engine.prompts.chatml_prompt. Figures of the reference (the snapshot issue 35 was checked
against), measured on its template for the question "QQQ": 153 characters in all, 117 before the
question and 33 after, a 70-character system text, 5 line breaks, 3 turn openings and 2 turn
ends; with its system text the prompt's SHA-256 is REFERENCE_QQQ_SHA256."""

from __future__ import annotations

import hashlib

from engine.prompts import CHATML_END, CHATML_START, MATH_SYSTEM, chatml_prompt

REFERENCE_QQQ_SHA256 = "ac16a1beabd71a4c1626f6b28cb3e675f4eb6e180cf3e2fd4f6c231446421c83"
REFERENCE_SYSTEM_CHARS = 70


def test_the_layout_matches_the_reference_figures():
    system = "s" * REFERENCE_SYSTEM_CHARS
    prompt = chatml_prompt("QQQ", system)
    before, after = prompt.split("QQQ")
    assert (len(prompt), len(before), len(after)) == (153, 117, 33)
    assert (prompt.count("\n"), prompt.count(CHATML_START), prompt.count(CHATML_END)) == (5, 3, 2)
    assert before == f"{CHATML_START}system\n{system}{CHATML_END}\n{CHATML_START}user\n"
    assert after == f"{CHATML_END}\n{CHATML_START}assistant\n"


def test_es_lab_s_own_instruction_asks_for_a_box():
    prompt = chatml_prompt("What is 1+1?")
    assert MATH_SYSTEM in prompt and "\\boxed{}" in MATH_SYSTEM
    assert hashlib.sha256(prompt.encode()).hexdigest() != REFERENCE_QQQ_SHA256
    assert prompt.endswith("What is 1+1?" + CHATML_END + "\n" + CHATML_START + "assistant\n")
