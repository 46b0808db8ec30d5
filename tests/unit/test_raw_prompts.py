"""Raw text prompts: datasets whose prompt column holds plain text, the run option that says
which kind a run expects, and how a raw prompt reaches the engine, the samples and a scorer."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.backends.base import Completion
from engine.config import ConfigError, RunConfig
from engine.data import DatasetError, Example, load_dataset, write_dataset
from engine.data.countdown_es_at_scale import context
from engine.prompts import render_prompt, user_text
from engine.scoring.sources import RewardSources
from engine.trainer.preflight import load_data
from tests.integration.scorers import stub_scorer
from tests.outputs import allow_temporary_outputs  # noqa: F401 (an autouse fixture)

# A countdown prompt in ES at Scale's form (raw text ending in "<think>", ES Lab's own words)
# and the alignment fork's conversation form (jbejjani2022/es-fine-tuning-paper).
COUNTDOWN = context([44, 19, 35], "98")
CONVERSATION = "BEGINNING OF CONVERSATION: USER: How do I bake bread? ASSISTANT:"
CHAT = [{"role": "user", "content": "Solve: 1 + 1 ="}]


def test_a_string_prompt_column_loads_as_raw_text_unchanged(tmp_path):
    path = tmp_path / "raw.parquet"
    pq.write_table(
        pa.table({"prompt": [COUNTDOWN, CONVERSATION], "reward_func_args": ["{}", "{}"]}), path
    )
    examples = load_dataset(path, expected_format="raw")
    assert [e.prompt for e in examples] == [COUNTDOWN, CONVERSATION]


def test_raw_examples_round_trip_as_a_string_column(tmp_path):
    path = write_dataset(
        [Example(COUNTDOWN, {"numbers": [44, 19, 35], "target": "98"}, {"id": 0})],
        tmp_path / "raw.parquet",
    )
    assert pa.types.is_string(pq.read_schema(path).field("prompt").type)
    (example,) = load_dataset(path)
    assert example == Example(COUNTDOWN, {"numbers": [44, 19, 35], "target": "98"}, {"id": 0})


@pytest.mark.parametrize(
    ("found", "expected", "prompt"),
    [("raw", "chat", COUNTDOWN), ("chat", "raw", CHAT)],
)
def test_a_dataset_of_the_other_kind_is_refused_naming_file_and_option(
    tmp_path, found, expected, prompt
):
    path = write_dataset([Example(prompt, {})], tmp_path / "d.parquet")
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(path, expected_format=expected)
    message = str(excinfo.value)
    assert message.startswith(f"{path}: the prompts are ")
    assert f"the run's prompt_format is {expected!r}: set prompt_format: {found}" in message


@pytest.mark.parametrize("bad", ["", "   \n", None])
def test_an_empty_raw_prompt_names_file_row_and_column(tmp_path, bad):
    path = tmp_path / "d.parquet"
    table = pa.table(
        {"prompt": pa.array([COUNTDOWN, bad], pa.string()), "reward_func_args": ["{}", "{}"]}
    )
    pq.write_table(table, path)
    with pytest.raises(
        DatasetError,
        match=re.escape(f"{path}: row 1, column 'prompt': must be a non-empty raw text prompt"),
    ):
        load_dataset(path)


def test_a_dataset_is_all_chat_or_all_raw(tmp_path):
    path = tmp_path / "d.parquet"
    with pytest.raises(
        DatasetError,
        match=re.escape(f"{path}: row 1, column 'prompt': is raw while row 0 is chat"),
    ):
        write_dataset([Example(CHAT, {}), Example(COUNTDOWN, {})], path)
    assert not path.exists()


def test_prompt_format_is_an_option_with_two_choices():
    base = {
        "train_file": "t.parquet",
        "output_dir": "data/runs/out",
        "reward_func_path": "engine.rewards.conciseness.compute_score",
    }
    assert RunConfig.from_flat(base).data.prompt_format == "chat"
    assert RunConfig.from_flat({**base, "prompt_format": "raw"}).data.prompt_format == "raw"
    with pytest.raises(ConfigError, match=r"data\.prompt_format"):
        RunConfig.from_flat({**base, "prompt_format": "text"})
    assert "prompt_format: raw" in RunConfig.from_flat({**base, "prompt_format": "raw"}).to_yaml()


def test_a_run_loads_raw_datasets_only_when_it_says_raw(tmp_path):
    train = write_dataset([Example(COUNTDOWN, {})], tmp_path / "train.parquet")
    flat = {
        "train_file": str(train),
        "output_dir": str(tmp_path / "out"),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
    }
    with pytest.raises(DatasetError, match="set prompt_format: raw"):
        load_data(RunConfig.from_flat(flat))
    data = load_data(RunConfig.from_flat({**flat, "prompt_format": "raw"}))
    assert data.train_set[0].prompt == COUNTDOWN


def test_samples_show_a_raw_prompt_as_written_and_a_chat_with_roles():
    assert render_prompt(COUNTDOWN) == COUNTDOWN
    assert render_prompt(CHAT) == "[user] Solve: 1 + 1 ="


def test_the_scorer_reads_the_user_text_of_a_conversation_prompt():
    """As the alignment fork's scorer client extracts it, so the scorer does not wrap the
    conversation form twice."""
    assert user_text(CONVERSATION) == "How do I bake bread?"
    assert user_text(COUNTDOWN) == COUNTDOWN
    assert user_text([{"role": "system", "content": "s"}, *CHAT]) == "Solve: 1 + 1 ="


def test_a_scorer_gets_the_user_text_of_raw_prompts():
    seen = []

    def answer(body: dict) -> tuple[int, bytes]:
        seen.append(body)
        n = len(body["prompts"])
        return 200, json.dumps({"rewards": [1.0] * n, "costs": [0.0] * n}).encode()

    outputs = [[Completion(" Mix flour.", 3, True)], [Completion("x", 1, True)]]
    with stub_scorer(answer) as url:
        config = RunConfig.from_flat(
            {
                "train_file": "t.parquet",
                "output_dir": "data/runs/o",
                "prompt_format": "raw",
                "reward_source": "scorer",
                "scorer_url": url,
            }
        )
        RewardSources.from_config(config).score(outputs, [CONVERSATION, COUNTDOWN], [{}, {}], "t")
    assert seen == [
        {"prompts": ["How do I bake bread?", COUNTDOWN], "responses": [" Mix flour.", "x"]}
    ]
