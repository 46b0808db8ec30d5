"""The alignment fork's prompt files to ES Lab datasets.

jbejjani2022/es-fine-tuning-paper trains on `alignment/data/custom_train_250.jsonl` and
evaluates on `custom_eval_500.jsonl`: PKU-SafeRLHF rows, one JSON object a line, of which the
fork reads the `prompt` (the two responses, their safety labels and sources are there for
other uses; they are kept in each example's metadata). The fork draws `--train_samples` and
`--eval_samples` prompts from them at random; a dataset here keeps every prompt in file
order, and the run's batches draw from it.

Two forms: `chat` (the prompt as the user's message: the policy's chat template wraps it)
and `conversation`, raw text in Safe-RLHF's conversation form, "BEGINNING OF CONVERSATION:
USER: ... ASSISTANT:", which is what the fork gives its policy (a run then sets
`prompt_format: raw`). Either way the scorer reads the user's words (engine.prompts.user_text).
The user's own copy of the files is read at run time; none is shipped here.
"""

from __future__ import annotations

from pathlib import Path

from engine.data.datasets import DatasetError, Example, WriteResult, json_lines, write_dataset
from engine.prompts import conversation_prompt

FORMS = ("chat", "conversation")


def convert_safe_rlhf(input_jsonl: str | Path, out_path: str | Path, form: str = "chat") -> WriteResult:
    """Write the prompts of a Safe-RLHF JSON-lines file as a dataset at `out_path`."""
    if form not in FORMS:
        raise DatasetError(f"--form must be one of {', '.join(FORMS)}, got {form!r}")
    rows = json_lines(input_jsonl, ("prompt",), "prompts")
    examples = [_example(row, form) for _, row in rows]
    path = write_dataset(examples, out_path)
    return WriteResult(
        [path], f"safe-rlhf: {len(examples)} prompts ({form}) from {input_jsonl} in {path}"
    )


def _example(row: dict, form: str) -> Example:
    prompt = row["prompt"]
    metadata = {k: v for k, v in row.items() if k != "prompt"}
    if form == "conversation":
        return Example(conversation_prompt(prompt), {}, metadata)
    return Example([{"role": "user", "content": prompt}], {}, metadata)
