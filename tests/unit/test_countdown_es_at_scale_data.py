"""`eslab data countdown --format es-at-scale`: ES at Scale's countdown layout and split,
seeded, its prompts raw, and the es-countdown preset that trains on it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine.data import DatasetError, load_dataset
from engine.data.countdown_es_at_scale import (
    context,
    generate_countdown_es_at_scale,
    generate_items,
    numbers_text,
    target_text,
)
from engine.presets import load_preset, preset_info
from engine.rewards import check_arguments, load_reward_function
from engine.rewards.countdown_es_at_scale import compute_score
from engine.trainer.preflight import load_data

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_KEYS = ["id", "context", "numbers", "target", "solution"]


def eslab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- the reference's own items ---------------------------------------------------------------


def test_the_prompt_is_es_labs_own_in_the_references_form():
    """Raw text ending in "<think>" (the grader puts it back in front of the completion), the
    numbers first in brackets as NumPy prints them (where the reference's scripts read them),
    in ES Lab's words: the reference's own text comes only from a user's file."""
    prompt = context([44, 19, 35], "98")
    assert prompt.endswith("\n<think>")
    assert prompt[prompt.index("[") + 1 : prompt.index("]")].split() == ["44", "19", "35"]
    assert "Target: 98." in prompt


@pytest.mark.parametrize(
    ("numbers", "text"),
    [([44, 19, 35], "[44 19 35]"), ([2, 54, 17], "[ 2 54 17]"), ([83, 78, 1, 39], "[83 78  1 39]")],
)
def test_numbers_are_printed_as_numpy_prints_them(numbers, text):
    assert numbers_text(numbers) == text


@pytest.mark.parametrize(
    ("numerator", "denominator", "solution", "target"),
    [
        (98, 1, "((44 + 19) + 35)", "98"),
        (-11, 1, "(69 - (55 + 25))", "-11"),
        (137, 5, "((98 / (47 - 52)) + 47)", "27.4"),
        (800, 3, "((10 / (60 - 57)) * 80)", "266.6666666666667"),
        (-173, 11, "((97 + 76) / (86 - 97))", "-15.727272727272727"),
    ],
)
def test_targets_are_written_as_the_references(numerator, denominator, solution, target):
    """Items 0, 365, 204, 254 and 263 of the reference's file."""
    assert target_text(numerator, denominator, solution) == target


# --- generation ------------------------------------------------------------------------------


def test_generation_is_seeded():
    assert generate_items(50, seed=7) == generate_items(50, seed=7)
    assert generate_items(50, seed=7) != generate_items(50, seed=8)


def test_puzzles_are_like_the_references():
    items = generate_items(2200, seed=42)
    assert [i.id for i in items] == list(range(2200))
    sizes = Counter(len(i.numbers) for i in items)
    assert set(sizes) == {3, 4} and 0.4 < sizes[3] / 2200 < 0.6
    assert all(1 <= n <= 99 for i in items for n in i.numbers)
    keys = Counter((tuple(sorted(i.numbers)), i.target) for i in items)
    assert max(keys.values()) == 1
    off_grid = [i for i in items if not (i.target.isdigit() and 1 <= int(i.target) <= 100)]
    assert 0.02 < len(off_grid) / 2200 < 0.06  # the reference: 81 of 2200
    assert any("." in i.target for i in off_grid) and any(i.target.startswith("-") for i in items)
    for item in items:
        assert item.context == context(item.numbers, item.target)
        assert re.fullmatch(r"\(.*\)", item.solution)  # fully parenthesised, as the reference
        completion = f"x</think>\n<answer>{item.solution}</answer>"
        score = compute_score(completion, numbers=item.numbers, target=item.target)
        assert score == {
            "reward": 1.1,
            "format_reward": 1.0,
            "answer_reward": 1.0,
            "accuracy": 1.0,
        }


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"n_train": 0}, "n_train must be at least 1, got 0"),
        ({"n_test": -1}, "n_test must be at least 1, got -1"),
        ({"n_given_numbers": 5}, "n_given_numbers must be 3 or 4"),
    ],
)
def test_bad_sizes_are_refused(tmp_path, kwargs, problem):
    with pytest.raises(DatasetError, match=re.escape(problem)):
        generate_countdown_es_at_scale(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_fixed_count_of_numbers(tmp_path):
    generate_countdown_es_at_scale(tmp_path, n_train=5, n_test=5, n_given_numbers=4)
    examples = load_dataset(tmp_path / "test.parquet", expected_format="raw")
    assert {len(e.reward_func_args["numbers"]) for e in examples} == {4}


# --- the command, end to end -----------------------------------------------------------------


def test_the_command_writes_the_references_layout_and_split(tmp_path):
    out = tmp_path / "es"
    result = eslab("data", "countdown", "--format", "es-at-scale", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "200 train and 2000 test puzzles" in result.stdout
    items = json.loads((out / "countdown.json").read_text())
    assert len(items) == 2200
    assert all(list(item) == REFERENCE_KEYS for item in items)
    assert all(isinstance(item["target"], str) for item in items)
    assert [item["id"] for item in items] == list(range(2200))
    # The reference's scripts take [0:200] to train and [-2000:] to test.
    for name, part in (("train", items[:200]), ("test", items[-2000:])):
        path = out / f"{name}.parquet"
        assert pq.read_schema(path).field("prompt").type == "string"
        examples = load_dataset(path, expected_format="raw")
        assert [e.prompt for e in examples] == [item["context"] for item in part]
        assert [e.reward_func_args for e in examples] == [
            {"numbers": item["numbers"], "target": item["target"]} for item in part
        ]
        assert [e.metadata for e in examples] == [
            {"id": item["id"], "solution": item["solution"]} for item in part
        ]
    assert all(item["context"] == context(item["numbers"], item["target"]) for item in items)
    again = tmp_path / "again"
    assert (
        eslab("data", "countdown", "--format", "es-at-scale", "--out", str(again)).returncode == 0
    )
    assert (again / "countdown.json").read_text() == (out / "countdown.json").read_text()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ([], "--format lbes needs --n-given-numbers 3 or 4"),
        (["--format", "es-at-scale", "--n-test", "0"], "n_test must be at least 1, got 0"),
        (["--format", "es-at-scale", "--n-given-numbers", "5"], "invalid choice: 5"),
        (["--format", "tinyzero"], "invalid choice: 'tinyzero'"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(tmp_path, args, problem):
    result = eslab("data", "countdown", "--out", str(tmp_path / "out"), *args)
    assert result.returncode == 2
    assert problem in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_es_countdown_preset_trains_on_what_its_command_writes(tmp_path):
    """The preset names the command that makes its data; that data passes the run's checks
    (raw prompts, the grader's arguments)."""
    config = load_preset("es-countdown")
    assert config.data.prompt_format == "raw"
    assert config.reward.reward_func_path == "engine.rewards.countdown_es_at_scale.compute_score"
    args = shlex.split(preset_info("es-countdown").data_command)[1:]
    folder = Path(args[args.index("--out") + 1])
    assert folder == Path(config.data.train_file).parent == Path(config.data.eval_file).parent
    args[args.index("--out") + 1] = str(tmp_path / folder)
    assert eslab(*args).returncode == 0
    moved = config.with_overrides(
        [
            f"train_file={tmp_path / config.data.train_file}",
            f"eval_file={tmp_path / config.data.eval_file}",
        ]
    )
    data = load_data(moved)  # refuses datasets that are not raw text
    func = load_reward_function(config.reward.reward_func_path)
    for examples in (data.train_set, data.eval_set):
        check_arguments("es-countdown", func, [e.reward_func_args for e in examples], "data")
    assert (len(data.train_set), len(data.eval_set)) == (200, 2000)
