"""The conciseness dataset of ES Lab: short questions with short target answers.

After the conciseness task of VsonicV/es-fine-tuning-paper (arXiv 2509.24372;
`es_fine-tuning_conciseness.py`), whose training set is two pairs such as
"Solve: 3 + 5 =" -> "8"; the questions here are written for ES Lab: simple arithmetic,
everyday facts and yes/no questions, answerable in a word or a number, so the conciseness
reward (minus the length difference to the target) is maximised by answering briefly and
nothing else. The prompt is the bare question, with no instruction to be brief: that is what
the model should learn from the reward.

The pairs live below as code so they can be reviewed; `write_conciseness` writes them to
parquet, and the files shipped in data/conciseness/ are its output.
"""

from __future__ import annotations

from pathlib import Path

from engine.data.datasets import Example, WriteResult, json_lines, write_dataset
from engine.paths import PROJECT_ROOT

SHIPPED_DIR = PROJECT_ROOT / "data" / "conciseness"

TRAIN_PAIRS: tuple[tuple[str, str], ...] = (
    ("Solve: 3 + 5 =", "8"),
    ("Solve: 9 - 4 =", "5"),
    ("Solve: 6 * 7 =", "42"),
    ("Solve: 20 / 4 =", "5"),
    ("Solve: 15 + 27 =", "42"),
    ("What is the capital of France?", "Paris"),
    ("How many days are in a week?", "7"),
    ("What color is the sky on a clear day?", "Blue"),
    ("Is the Sun a star?", "Yes"),
    ("How many legs does a spider have?", "8"),
    ("What is the opposite of hot?", "Cold"),
    ("Which planet do we live on?", "Earth"),
    ("What is the chemical formula of water?", "H2O"),
    ("How many minutes are in an hour?", "60"),
    ("Is ice colder than boiling water?", "Yes"),
    ("What is the first letter of the English alphabet?", "A"),
)

TEST_PAIRS: tuple[tuple[str, str], ...] = (
    ("Solve: 4 + 9 =", "13"),
    ("Solve: 30 - 12 =", "18"),
    ("Solve: 8 * 3 =", "24"),
    ("Solve: 36 / 6 =", "6"),
    ("Solve: 11 + 11 =", "22"),
    ("What is the capital of Japan?", "Tokyo"),
    ("How many months are in a year?", "12"),
    ("What color is fresh grass?", "Green"),
    ("Can a penguin fly?", "No"),
    ("How many wheels does a bicycle have?", "2"),
    ("What is the opposite of up?", "Down"),
    ("What is the largest planet in the Solar System?", "Jupiter"),
    ("What gas do plants take from the air to make their food?", "Carbon dioxide"),
    ("How many hours are in a day?", "24"),
    ("Is a whale a mammal?", "Yes"),
    ("What is the last letter of the English alphabet?", "Z"),
)


def to_examples(pairs: tuple[tuple[str, str], ...]) -> list[Example]:
    return [
        Example(
            prompt=[{"role": "user", "content": question}],
            reward_func_args={"target": answer},
        )
        for question, answer in pairs
    ]


def write_conciseness(out_dir: str | Path = SHIPPED_DIR) -> WriteResult:
    """Write `out_dir/train.parquet` and `out_dir/test.parquet` from the pairs above."""
    out_dir = Path(out_dir)
    paths = [
        write_dataset(to_examples(TRAIN_PAIRS), out_dir / "train.parquet"),
        write_dataset(to_examples(TEST_PAIRS), out_dir / "test.parquet"),
    ]
    summary = (
        f"conciseness: {len(TRAIN_PAIRS)} train and {len(TEST_PAIRS)} test questions in {out_dir}"
    )
    return WriteResult(paths, summary)


def convert_conciseness_pairs(input_jsonl: str | Path, out_path: str | Path) -> WriteResult:
    """The ES paper's own conciseness pairs (the jbejjani2022 fork's `conciseness/data/
    train.jsonl` and `eval.jsonl`: {"question": ..., "answer": ...} a line) as a dataset of
    raw prompts, the bare question as the reference feeds it to the model (no chat
    template; a run sets `prompt_format: raw`), with the answer as the reward's target."""
    rows = json_lines(input_jsonl, ("question", "answer"), "pairs")
    examples = [Example(row["question"], {"target": row["answer"]}) for _, row in rows]
    path = write_dataset(examples, out_path)
    return WriteResult(
        [path], f"conciseness: {len(examples)} raw-prompt pairs from {input_jsonl} in {path}"
    )
