"""nlp-waseda/lbes's own shipped data (`data/countdown3/*.parquet`, `data/gsm8k/*.parquet`)
trains as it is: the faithful route to its experiments, since `eslab data countdown` and
`eslab data gsm8k` write ES Lab's own system prompts.

The files are built here in the reference's layout, as its Hugging Face `to_parquet` writes
them: `prompt` a list<struct<content, role>> (content first) of a system and a user message,
`reward_func_args` a struct (countdown: numbers list<int64>, target int64; gsm8k: ground_truth
string), the `huggingface` schema metadata beside; the texts are placeholders, not its
prompts. They pass a run's own checks before it starts (engine.trainer.preflight).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import metrics as mk
from engine.data import load_dataset
from engine.presets import load_preset
from engine.rewards import load_reward_function, score_completion
from engine.trainer.preflight import plan_total_steps

MESSAGES = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
COUNTDOWN_ARGS = pa.struct([("numbers", pa.list_(pa.int64())), ("target", pa.int64())])
GSM8K_ARGS = pa.struct([("ground_truth", pa.string())])


def lbes_file(path: Path, questions: list[str], args: list[dict], args_type: pa.DataType) -> Path:
    prompts = [
        [
            {
                "content": "Placeholder system message: think, then answer in tags.",
                "role": "system",
            },
            {"content": question, "role": "user"},
        ]
        for question in questions
    ]
    schema = pa.schema(
        [("prompt", MESSAGES), ("reward_func_args", args_type)],
        metadata={"huggingface": json.dumps({"info": {"features": {}}})},
    )
    table = pa.table(
        {"prompt": pa.array(prompts, MESSAGES), "reward_func_args": pa.array(args, args_type)},
        schema=schema,
    )
    pq.write_table(table, path)
    return path


TASKS = {
    "countdown3": (
        "engine.rewards.countdown.compute_score",
        [{"numbers": [62, 31, 39], "target": 78}, {"numbers": [5, 3, 2], "target": 13}],
        COUNTDOWN_ARGS,
        "<think>62 / 31 = 2, 2 * 39 = 78</think><answer>62 / 31 * 39</answer>",
    ),
    "gsm8k": (
        "engine.rewards.gsm8k.compute_score",
        [{"ground_truth": "18"}, {"ground_truth": "1,200"}],
        GSM8K_ARGS,
        "<think>16 - 3 - 4 = 9 eggs, 9 * 2 = 18</think><answer>18</answer>",
    ),
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_lbes_references_files_train_as_they_are(tmp_path, task):
    reward, args, args_type, correct = TASKS[task]
    questions = [f"Placeholder question {i}" for i in range(len(args))]
    files = {
        split: lbes_file(tmp_path / f"{split}.parquet", questions, args, args_type)
        for split in ("train", "test")
    }
    examples = load_dataset(files["train"], expected_format="chat")
    assert [[m["role"] for m in e.prompt] for e in examples] == [["system", "user"]] * len(args)
    assert [e.prompt[1]["content"] for e in examples] == questions
    assert [e.reward_func_args for e in examples] == args
    # the struct's types, not only equal values (78 == 78.0)
    assert all(type(v) is type(args[0][k]) for k, v in examples[0].reward_func_args.items())
    # lbes-countdown's setup on these files, on the reference's model (a hub name is checked
    # when it downloads): the run's checks of data, prompt format and reward arguments pass.
    config = load_preset("lbes-countdown").with_overrides(
        [
            "model=meta-llama/Llama-3.1-8B-Instruct",
            f"train_file={files['train']}",
            f"eval_file={files['test']}",
            f"reward_func_path={reward}",
        ]
    )
    assert plan_total_steps(config) == config.data.max_steps
    scores = score_completion(
        load_reward_function(reward), correct, examples[0].reward_func_args, sample_description="s"
    )
    assert scores[mk.ACCURACY] == 1.0
