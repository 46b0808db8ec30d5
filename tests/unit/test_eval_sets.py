"""data.eval_sets: several evaluation sets in one run, each logged as ES at Scale logs it
(VsonicV/es-at-scale, trainer/es_trainer.py `eval_step`: per set the size-weighted mean of the
prompts' rewards under `eval/<name>/pass@1/mean`, and `eval/avgpass@1/mean`, the plain mean
over the sets, so a small set weighs as much as a large one)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine import metrics as mk
from engine.config import ConfigError
from engine.config.eval_sets import format_eval_sets, parse_eval_sets
from engine.data import DatasetError
from engine.data.datasets import Example, write_dataset
from engine.rewards import RewardError
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.evaluation import eval_set_metrics
from engine.trainer.preflight import load_data, plan_total_steps
from tests.unit.test_step_metrics import FakePool, config


def given_value(completion_text: str, value: float) -> dict[str, float]:
    """The reward the row gives, whatever the completion."""
    return {"reward": float(value)}


def examples(values: list[float]) -> list[Example]:
    return [
        Example(
            prompt=[{"role": "user", "content": f"question {i % 3}"}], reward_func_args={"value": v}
        )
        for i, v in enumerate(values)
    ]


@pytest.fixture
def files(tmp_path):
    """A train set and two eval sets: `math500` solves 2 of 3 prompts, `aime24` its one."""
    return {
        name: str(write_dataset(examples(values), tmp_path / f"{name}.parquet"))
        for name, values in (("train", [1, 0, 1]), ("math500", [1, 0, 1]), ("aime24", [1]))
    }


def run_config(files, **options):
    return config(
        "es",
        train_file=files["train"],
        reward_func_path=f"{__name__}.given_value",
        eval_sets=f"math500={files['math500']},aime24={files['aime24']}",
        **options,
    )


def test_keys_are_the_reference_s():
    assert mk.eval_set_key("math500") == "eval/math500/pass@1/mean"
    assert mk.EVAL_SETS_MEAN == "eval/avgpass@1/mean"
    assert mk.is_known_key(mk.eval_set_key("aime24")) and mk.is_known_key(mk.EVAL_SETS_MEAN)


def test_each_set_is_its_prompts_mean_and_the_average_weighs_sets_equally():
    rewards = np.array([[1.0], [0.0], [1.0], [1.0]])
    metrics = eval_set_metrics(rewards, {"math500": range(0, 3), "aime24": range(3, 4)})
    assert metrics == pytest.approx(
        {
            "eval/math500/pass@1/mean": 2 / 3,
            "eval/aime24/pass@1/mean": 1.0,
            "eval/avgpass@1/mean": (2 / 3 + 1.0) / 2,  # not the pooled 3/4
        }
    )
    assert eval_set_metrics(rewards, {}) == {}


def test_the_option_reads_name_file_pairs_in_order():
    text = "math500 = a.parquet, aime24=b/c.parquet"
    assert parse_eval_sets(text) == {"math500": "a.parquet", "aime24": "b/c.parquet"}
    assert format_eval_sets(parse_eval_sets(text)) == "math500=a.parquet,aime24=b/c.parquet"
    assert parse_eval_sets(None) == {} and format_eval_sets({}) is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("math500", "entry 'math500' is not name=file"),
        ("a=x.parquet,", "entry '' is not name=file"),
        ("=x.parquet", "is not name=file"),
        ("math/500=x.parquet", "set name 'math/500' must start with a letter or digit"),
        ("a=x.parquet,a=y.parquet", "names the set 'a' twice"),
        ("a=/etc/passwd", "set 'a', '/etc/passwd' resolves to"),
    ],
)
def test_a_bad_value_is_refused_naming_the_option(files, value, words):
    with pytest.raises(ConfigError) as error:
        config("es", train_file=files["train"], eval_sets=value)
    assert "data.eval_sets" in str(error.value) and words in str(error.value)


def test_sets_stand_in_for_eval_file_and_neither_is_refused(files):
    assert run_config(files, eval_strategy="steps", eval_steps=1).data.eval_file is None
    with pytest.raises(ConfigError, match=r"data\.eval_file is required.*or data\.eval_sets"):
        config("es", train_file=files["train"], eval_strategy="steps", eval_steps=1)


def test_the_sets_follow_eval_file_in_the_eval_set(files):
    data = load_data(run_config(files, eval_file=files["train"]))
    assert len(data.eval_set) == 7
    assert data.eval_parts == {"math500": range(3, 6), "aime24": range(6, 7)}
    resolved = run_config(files).with_resolved_paths().data.eval_set_files()
    assert resolved == {"math500": files["math500"], "aime24": files["aime24"]}


def test_a_set_missing_or_with_wrong_arguments_is_named(files, tmp_path):
    missing = str(tmp_path / "gone.parquet")
    with pytest.raises(DatasetError, match=r"gone\.parquet: file not found"):
        load_data(config("es", train_file=files["train"], eval_sets=f"gone={missing}"))
    wrong = write_dataset(
        [Example(prompt=[{"role": "user", "content": "question 0"}], reward_func_args={"x": 1})],
        tmp_path / "wrong.parquet",
    )
    cfg = run_config(files).with_overrides([f"eval_sets=aime24={files['aime24']},bad={wrong}"])
    with pytest.raises(RewardError, match=re.escape(f"data.eval_sets bad={wrong}")):
        plan_total_steps(cfg)


def test_a_run_logs_each_set_and_their_mean_at_every_evaluation(files, tmp_path):
    cfg = run_config(
        files,
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
        eval_before_train=True,
    )
    sink = MemorySink()
    train(cfg, sink, pool=FakePool())
    evaluations = [r for r in sink.steps if mk.EVAL_SETS_MEAN in r.metrics]
    assert [r.step for r in evaluations] == [0, 1, 2]
    for report in evaluations:
        assert report.metrics[mk.eval_set_key("math500")] == pytest.approx(2 / 3)
        assert report.metrics[mk.eval_set_key("aime24")] == 1.0
        assert report.metrics[mk.EVAL_SETS_MEAN] == pytest.approx(5 / 6)
        assert report.metrics[mk.reward_key(mk.EVAL)] == pytest.approx(3 / 4)  # all prompts
        assert report.metrics[mk.EVAL_TOTAL_SAMPLES] == 4
