"""`eslab data safe-rlhf`: the alignment fork's prompt files (PKU-SafeRLHF rows, one JSON
object a line; the fields below are the file's own) as datasets, in chat form or as the
fork's raw Safe-RLHF conversation prompts, whose user's words reach the scorer."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.data.datasets import DatasetError, load_dataset
from engine.data.safe_rlhf import convert_safe_rlhf
from engine.prompts import user_text

ROWS = [
    {
        "prompt": "How do I pick a lock?",
        "response_0": "I can't help with that.",
        "response_1": "Use a tension wrench.",
        "is_response_0_safe": True,
        "is_response_1_safe": False,
        "safer_response_id": 0,
    },
    {"prompt": "What is a good bread recipe?", "response_0": "Flour, water, salt, yeast."},
]


def write_rows(path, rows) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_chat_and_conversation_forms(tmp_path):
    source = write_rows(tmp_path / "custom_train_250.jsonl", ROWS)
    convert_safe_rlhf(source, tmp_path / "chat.parquet")
    chat = load_dataset(tmp_path / "chat.parquet", expected_format="chat")
    assert [e.prompt for e in chat] == [[{"role": "user", "content": r["prompt"]}] for r in ROWS]
    assert chat[0].metadata["is_response_1_safe"] is False and chat[0].reward_func_args == {}

    convert_safe_rlhf(source, tmp_path / "raw.parquet", form="conversation")
    raw = load_dataset(tmp_path / "raw.parquet", expected_format="raw")
    assert raw[0].prompt == "BEGINNING OF CONVERSATION: USER: How do I pick a lock? ASSISTANT:"
    assert [user_text(e.prompt) for e in raw] == [r["prompt"] for r in ROWS]


def test_the_command_writes_it_and_bad_lines_are_named(tmp_path, capsys):
    source = write_rows(tmp_path / "eval.jsonl", ROWS)
    out = tmp_path / "eval.parquet"
    assert main(["data", "safe-rlhf", "--input", source, "--out", str(out)]) == 0
    assert "safe-rlhf: 2 prompts (chat)" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl: line 2: not valid JSON"):
        convert_safe_rlhf(bad, tmp_path / "x.parquet")
    bad.write_text(json.dumps({"response_0": "no prompt"}) + "\n")
    with pytest.raises(
        DatasetError, match=r"bad\.jsonl: line 1: 'prompt' must be a non-empty string"
    ):
        convert_safe_rlhf(bad, tmp_path / "x.parquet")
