"""ES at Scale's countdown as its paper's Table 1 ran it: the user's copy of the reference's
countdown.json converted with its exact splits (`eslab data countdown --format es-at-scale
--input FILE`), the es-at-scale-countdown preset with the reference's numbers, and accuracy
(answer_reward > 0) reported per evaluation and usable as a sweep objective.

The files here are built in the test with the reference's schema (a JSON list of {id, context,
numbers, target, solution}); no test reads the reference's own file, and the contexts are
placeholders, not its prompt.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from app.cli import main
from engine import metrics as mk
from engine.backends.base import Completion
from engine.data import load_dataset
from engine.data.countdown_es_at_scale import context
from engine.presets import load_preset, preset_info, preset_path
from engine.scoring.batch import score_batch
from engine.trainer.preflight import plan_total_steps
from engine.trainer.reporting import part_means
from jobs.sweeps import SweepSpecError, parse_space

PRESET = "es-at-scale-countdown"
GRADER = "engine.rewards.countdown_es_at_scale.compute_score"
REFERENCE_KEYS = ("id", "context", "numbers", "target", "solution")


def puzzle(index: int, *, with_context: bool = True) -> dict:
    """Puzzle `index` in the reference's schema: 3 or 4 numbers and its target as text, some
    negative or non-integer, as in the reference's file."""
    numbers = [index % 97 + 1, index % 89 + 2, index % 83 + 3] + ([index % 7 + 1] * (index % 2))
    target = str(sum(numbers))
    if index % 11 == 0:
        target = str(numbers[0] - sum(numbers[1:]))
    elif index % 13 == 0:
        target = f"{sum(numbers)}.5"
    item = {
        "id": index,
        "context": f"Placeholder prompt {index}: reach {target} from {numbers}.\n<think>",
        "numbers": numbers,
        "target": target,
        "solution": " + ".join(map(str, numbers)),
    }
    if not with_context:
        del item["context"]
    return item


def reference_file(path: Path, count: int, **kwargs) -> Path:
    path.write_text(json.dumps([puzzle(i, **kwargs) for i in range(count)]), encoding="utf-8")
    return path


def convert(*args: str) -> int:
    return main(["data", "countdown", "--format", "es-at-scale", *args])


# --- the converter ---------------------------------------------------------------------------


def test_the_references_2200_puzzles_split_into_its_first_200_and_last_2000(tmp_path, capsys):
    source = reference_file(tmp_path / "countdown.json", 2200)
    items = json.loads(source.read_text())
    assert convert("--input", str(source), "--out", str(tmp_path / "out")) == 0
    out = capsys.readouterr().out
    assert "puzzles 0-199 train and 200-2199 test (200 and 2000)" in out
    assert "the file's own prompts" in out
    for name, part in (("train", items[:200]), ("test", items[-2000:])):
        examples = load_dataset(tmp_path / "out" / f"{name}.parquet", expected_format="raw")
        assert [e.prompt for e in examples] == [item["context"] for item in part]
        assert [e.reward_func_args for e in examples] == [
            {"numbers": item["numbers"], "target": item["target"]} for item in part
        ]
        assert [e.metadata for e in examples] == [
            {"id": item["id"], "solution": item["solution"]} for item in part
        ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.parquet", "train.parquet"]


def test_other_split_sizes_are_stated_and_still_first_and_last(tmp_path, capsys):
    source = reference_file(tmp_path / "small.json", 7)
    assert (
        convert(
            "--input", str(source), "--n-train", "3", "--n-test", "4", "--out", str(tmp_path / "o")
        )
        == 0
    )
    train = load_dataset(tmp_path / "o" / "train.parquet")
    test = load_dataset(tmp_path / "o" / "test.parquet")
    assert [e.metadata["id"] for e in train] == [0, 1, 2]
    assert [e.metadata["id"] for e in test] == [3, 4, 5, 6]


def test_a_file_without_prompts_gets_es_labs_prompt(tmp_path, capsys):
    source = reference_file(tmp_path / "bare.json", 5, with_context=False)
    assert (
        convert(
            "--input", str(source), "--n-train", "2", "--n-test", "3", "--out", str(tmp_path / "o")
        )
        == 0
    )
    assert "ES Lab's prompt (the file has no 'context')" in capsys.readouterr().out
    (first, _) = load_dataset(tmp_path / "o" / "train.parquet", expected_format="raw")
    item = puzzle(0)
    assert first.prompt == context(item["numbers"], item["target"])


def _with(change):
    def build(path: Path) -> None:
        items = [puzzle(i) for i in range(2200)]
        change(items)
        path.write_text(json.dumps(items), encoding="utf-8")

    return build


@pytest.mark.parametrize(
    ("write", "problem"),
    [
        (lambda p: None, "file not found"),
        (lambda p: p.write_text("[{'id': 0}]"), "not JSON"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "not UTF-8 text"),
        (lambda p: p.write_text('{"puzzles": []}'), "expected a JSON list of puzzles"),
        (
            lambda p: reference_file(p, 2150),
            "2150 puzzles, expected 2200: ES at Scale's countdown.json holds 2200 (the first "
            "200 train, the last 2000 test)",
        ),
        (_with(lambda items: items.__setitem__(7, [1, 2])), "puzzle 7: expected a JSON object"),
        (_with(lambda items: items[9].pop("target")), "puzzle 9: no 'target'"),
        (_with(lambda items: items[3].__setitem__("numbers", "1 2 3")), "puzzle 3: numbers must"),
        (
            _with(lambda items: items[4].__setitem__("numbers", [1, 2.5])),
            "puzzle 4: numbers must be whole numbers",
        ),
        (
            _with(lambda items: items[5].__setitem__("target", "ninety")),
            "puzzle 5: target must be a number or its text, got 'ninety'",
        ),
        (
            _with(lambda items: items[6].__setitem__("context", 12)),
            "puzzle 6: 'context' must be a non-empty string",
        ),
        (
            _with(lambda items: items[8].pop("context")),
            "puzzle 8: no 'context' while other puzzles have one",
        ),
    ],
)
def test_bad_files_are_refused_naming_the_file_and_what_is_wrong(tmp_path, capsys, write, problem):
    source = tmp_path / "countdown.json"
    write(source)
    assert convert("--input", str(source), "--out", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert f"{source}: " in err and problem in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--format", "lbes"], "--input reads ES at Scale's countdown.json: give --format"),
        (["--format", "es-at-scale", "--seed", "3"], "--seed only apply to generated puzzles"),
        (
            ["--format", "es-at-scale", "--n-given-numbers", "3"],
            "--n-given-numbers only apply to generated puzzles",
        ),
    ],
)
def test_generator_options_are_refused_with_input(tmp_path, capsys, args, problem):
    source = reference_file(tmp_path / "countdown.json", 2200)
    command = ["data", "countdown", *args, "--input", str(source), "--out", str(tmp_path / "o")]
    assert main(command) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --- the preset ------------------------------------------------------------------------------


def test_the_preset_carries_the_references_numbers():
    """VsonicV/es-at-scale at 574a9d1, archive/es_fine-tuning_countdown.py:32-37: 500
    iterations, population 30, sigma 0.001, alpha 0.0005, 1024 new tokens, greedy; every
    member scores all 200 train prompts (its lines 154-157 and --data_sample 200)."""
    config = load_preset(PRESET)
    assert config.method == "es"
    assert config.model.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.es.population_size == 30
    assert config.es.noise_std == 0.001
    # ES Lab's lr / (N * sigma) against the reference's alpha / N: lr = alpha * sigma
    assert config.es.initial_learning_rate == pytest.approx(0.0005 * 0.001, rel=1e-12)
    assert config.es.lr_scheduler_type == "constant" and config.es.fitness_shaping == "zscore"
    assert not config.es.antithetic
    assert config.sampling.max_tokens == 1024
    assert config.sampling.temperature == 0.0 and config.sampling.n == 1
    assert config.data.data_batch_size == 200 and config.data.max_steps == 500
    assert config.data.prompt_format == "raw"
    assert config.reward.reward_func_path == GRADER
    assert config.eval.eval_strategy == "steps" and config.eval.eval_before_train


def test_each_number_of_the_preset_says_where_in_the_reference_it_comes_from():
    lines = preset_path(PRESET).read_text().splitlines()
    for key in ("population_size", "noise_std", "learning_rate", "max_tokens", "max_steps"):
        (line,) = [line for line in lines if line.startswith(f"{key}:")]
        assert re.search(r"# ES:\d+", line), line
    assert any("574a9d1" in line for line in lines)


def test_the_preset_trains_on_what_its_data_command_writes(tmp_path, monkeypatch, capsys):
    """The preset's Data line converts a file of the reference's schema into the files it
    names, and the run's checks (data, prompt format, grader arguments) accept them."""
    info = preset_info(PRESET)
    assert "countdown.json" in " ".join(info.needs)
    args = shlex.split(info.data_command)
    assert args[:5] == ["eslab", "data", "countdown", "--format", "es-at-scale"]
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    reference_file(tmp_path / args[args.index("--input") + 1], 2200)
    assert main(args[1:]) == 0, capsys.readouterr().err
    config = load_preset(PRESET)
    assert plan_total_steps(config) == 500  # the hub model is checked when it downloads
    assert (
        len(load_dataset(tmp_path / "data" / "countdown-es-at-scale-paper" / "test.parquet"))
        == 2000
    )


# --- accuracy --------------------------------------------------------------------------------


def test_accuracy_is_the_share_of_completions_whose_answer_is_right():
    """As the reference's evaluation counts it: answer_reward > 0, whatever the format."""
    args = {"numbers": [44, 19, 35], "target": "98"}
    texts = [
        " 44 + 19 = 63</think>\n<answer>(44 + 19) + 35</answer>",  # right, well formatted
        "<answer>44 + 19 + 35</answer>",  # right, format credit 0.5 only
        " I try</think>\n<answer>44 + 19 - 35</answer>",  # well formatted, wrong
        "no answer",
    ]
    outputs = [[Completion(text, 5, True)] for text in texts]
    batch = score_batch(outputs, [args] * len(texts), GRADER, "test")
    assert batch.parts[mk.ACCURACY].reshape(-1).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert part_means(mk.EVAL, [batch])[mk.EVAL_ACCURACY] == 0.5


def test_accuracy_is_a_key_of_its_own_and_a_sweep_objective_of_the_preset():
    assert (mk.TRAIN_ACCURACY, mk.EVAL_ACCURACY) == ("train/accuracy/mean", "eval/accuracy/mean")
    assert {mk.TRAIN_ACCURACY, mk.EVAL_ACCURACY} <= mk.fixed_keys()
    assert mk.close_key("eval/acuracy/mean") == mk.EVAL_ACCURACY
    space = {"objective": mk.EVAL_ACCURACY, "parameters": {"seed": {"values": [1, 2]}}}
    spec = parse_space(space, load_preset(PRESET))
    assert (spec.objective.metric, spec.objective.mode) == (mk.EVAL_ACCURACY, "max")
    # an evaluation's metric needs runs that evaluate
    quiet = load_preset(PRESET).with_overrides(["eval_strategy=no"])
    with pytest.raises(SweepSpecError, match="reported only by runs that evaluate"):
        parse_space(space, quiet)
