"""`eslab data math`: ES at Scale's math DatasetDict folders (its `train.py` reads them with
`load_from_disk`) to ES Lab datasets, its prompt text read from the user's copy of its template
file, and the es-at-scale-math preset with the reference's numbers.

tests/unit/data/math_es_at_scale/ holds two tiny DatasetDicts written by Hugging Face
`datasets` 5.2.0's own `save_to_disk` (placeholder problems, not the reference's data): `eval`
with splits aime (2 rows) and math500 (1), `train` with split train (4); each row has
problem, answer and an extra level column."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from pathlib import Path

import pytest

from app.cli import main
from engine.data import DatasetError, load_dataset
from engine.data.math_es_at_scale import convert_math_es_at_scale, read_template
from engine.presets import load_preset, preset_info, preset_path
from engine.prompts import MATH_SYSTEM, chatml_prompt
from engine.rewards.math_boxed import compute_score
from engine.trainer.preflight import plan_total_steps
from tests.unit.test_math_prompt import REFERENCE_QQQ_SHA256

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "math_es_at_scale"
REFERENCE_TEMPLATE = (
    ROOT / "build" / "es-at-scale" / "es_at_scale" / "template_function" / "apply_template.py"
)
PRESET = "es-at-scale-math"
OWN_TEMPLATE = """
def other_template(question: str):
    return question


def qwen_math_template(question: str):
    return (
        "<|im_start|>system\\nShow your work.<|im_end|>\\n<|im_start|>user\\n"
        + question
        + "<|im_end|>\\n<|im_start|>assistant\\n"
    )
"""


def test_each_evaluation_split_becomes_a_set_and_the_train_split_the_train_file(tmp_path):
    result = convert_math_es_at_scale(FIXTURE / "eval", tmp_path, train_dir=FIXTURE / "train")
    aime = load_dataset(tmp_path / "eval" / "aime.parquet", expected_format="raw")
    assert [e.prompt for e in aime] == [
        chatml_prompt("Find x if 2x = 10."),
        chatml_prompt("What is half of one?"),
    ]
    assert [e.reward_func_args for e in aime] == [
        {"ground_truth": "5"},
        {"ground_truth": "\\frac{1}{2}"},
    ]
    assert len(load_dataset(tmp_path / "eval" / "math500.parquet")) == 1
    train = load_dataset(tmp_path / "train.parquet")
    assert [e.reward_func_args["ground_truth"] for e in train] == ["1", "2", "3", "4"]
    (line,) = [line for line in result.summary.splitlines() if line.startswith("eval_sets: ")]
    assert line == (
        f"eval_sets: aime={tmp_path / 'eval' / 'aime.parquet'},"
        f"math500={tmp_path / 'eval' / 'math500.parquet'}"
    )
    # the grader takes the rows' arguments: a boxed 1/2 answers aime's second problem
    assert compute_score("so \\boxed{0.5}", **aime[1].reward_func_args)["reward"] == 1.0


def test_the_template_s_text_is_read_from_the_user_s_file_not_run(tmp_path):
    template = tmp_path / "apply_template.py"
    template.write_text(OWN_TEMPLATE + "\nraise SystemExit('must not run')\n", encoding="utf-8")
    convert_math_es_at_scale(FIXTURE / "eval", tmp_path / "out", template_file=template)
    (row,) = load_dataset(tmp_path / "out" / "eval" / "math500.parquet")
    assert row.prompt == chatml_prompt("Compute 3+4.", "Show your work.")
    assert MATH_SYSTEM not in row.prompt


@pytest.mark.skipif(not REFERENCE_TEMPLATE.is_file(), reason="no copy of the reference here")
def test_the_reference_s_own_template_gives_its_prompt():
    prompt = read_template(REFERENCE_TEMPLATE)("QQQ")
    assert hashlib.sha256(prompt.encode()).hexdigest() == REFERENCE_QQQ_SHA256


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("return 'x' + question", None),
        ("return question.upper()", "no qwen_math_template"),
        ("return 'a' + question + question", "no qwen_math_template"),
        ("return f'a{question}'", "no qwen_math_template"),
    ],
)
def test_a_template_of_another_shape_is_refused(tmp_path, source, problem):
    path = tmp_path / "t.py"
    path.write_text(f"def qwen_math_template(question):\n    {source}\n", encoding="utf-8")
    if problem is None:
        assert read_template(path)("q") == "xq"
    else:
        with pytest.raises(DatasetError, match=f"{re.escape(str(path))}: {problem}"):
            read_template(path)


def rename_a_split(folder: Path) -> None:
    (folder / "aime").rename(folder / "a b")
    (folder / "dataset_dict.json").write_text('{"splits": ["a b", "math500"]}')


def copy_fixture(tmp_path: Path) -> Path:
    folder = tmp_path / "eval"
    shutil.copytree(FIXTURE / "eval", folder)
    return folder


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda f: (f / "dataset_dict.json").unlink(), "no dataset_dict.json"),
        (lambda f: (f / "dataset_dict.json").write_text('{"splits": []}'), "'splits' must be"),
        (lambda f: (f / "aime" / "state.json").unlink(), "aime: no state.json"),
        (
            lambda f: (f / "aime" / "data-00000-of-00001.arrow").write_bytes(b"nope"),
            "not a readable Arrow stream file",
        ),
        (rename_a_split, "split 'a b' cannot name an eval set"),
    ],
)
def test_a_damaged_folder_is_refused_naming_what_is_wrong(tmp_path, damage, problem):
    folder = copy_fixture(tmp_path)
    damage(folder)
    with pytest.raises(DatasetError, match=re.escape(problem)):
        convert_math_es_at_scale(folder, tmp_path / "out")


def test_the_command_line_converts_and_names_the_folder_on_error(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["data", "math", "--input", str(FIXTURE / "eval"), "--out", str(out)]) == 0
    assert "eval_sets: aime=" in capsys.readouterr().out
    assert main(["data", "math", "--input", str(tmp_path), "--out", str(out)]) != 0
    assert f"{tmp_path}: no dataset_dict.json" in capsys.readouterr().err


# --- the preset ------------------------------------------------------------------------------


def test_the_preset_carries_the_references_numbers():
    """es_at_scale/train.py's defaults and its README's math example: population 30, sigma
    0.001, alpha sigma / 2, z-scores, 300 iterations, evaluation every 5, 1024 prompts, 3000
    tokens, greedy, one completion, a 10 s grading timeout scoring 0."""
    config = load_preset(PRESET)
    assert config.method == "es" and config.model.model == "Qwen/Qwen2.5-Math-7B"
    assert config.es.population_size == 30 and config.es.noise_std == 0.001
    # alpha = sigma / 2 of the reference's alpha / N update is lr = alpha * sigma here
    assert config.es.initial_learning_rate == pytest.approx(0.001 / 2 * 0.001, rel=1e-12)
    assert config.es.fitness_shaping == "zscore" and not config.es.antithetic
    assert (config.sampling.max_tokens, config.sampling.temperature, config.sampling.n) == (
        3000,
        0.0,
        1,
    )
    assert config.data.data_batch_size == 1024 and config.data.max_steps == 300
    assert config.data.prompt_format == "raw" and config.data.eval_file is None
    assert list(config.data.eval_set_files()) == [
        "amc",
        "aime",
        "math500",
        "minerva",
        "olympiad_bench",
    ]
    assert config.reward.reward_func_path == "engine.rewards.math_boxed.compute_score"
    assert config.reward.reward_timeout_seconds == 10
    assert config.reward.reward_timeout_action == "score_zero"
    assert (config.eval.eval_strategy, config.eval.eval_steps) == ("steps", 5)
    assert config.eval.eval_before_train


def test_each_number_of_the_preset_says_where_in_the_reference_it_comes_from():
    lines = preset_path(PRESET).read_text().splitlines()
    for key in ("population_size", "noise_std", "learning_rate_rule", "max_tokens", "seed"):
        (line,) = [line for line in lines if line.startswith(f"{key}:")]
        assert re.search(r"# (TRAIN|ES):\d+|# README", line), line
    for key in ("max_steps", "data_batch_size", "eval_steps"):
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"{key}:")]
        assert "README" in lines[at] or "README" in lines[at - 1], lines[at]


def test_the_preset_trains_on_what_its_data_command_writes(tmp_path, monkeypatch, capsys):
    info = preset_info(PRESET)
    args = shlex.split(info.data_command)
    assert args[:3] == ["eslab", "data", "math"]
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / args[args.index("--input") + 1]
    shutil.copytree(FIXTURE / "eval", suite)
    (suite / "dataset_dict.json").write_text(
        '{"splits": ["amc", "aime", "math500", "minerva", "olympiad_bench"]}'
    )
    for split in ("amc", "minerva", "olympiad_bench"):
        shutil.copytree(suite / "math500", suite / split)
    shutil.copytree(FIXTURE / "train", tmp_path / args[args.index("--train") + 1])
    (tmp_path / args[args.index("--template") + 1]).write_text(OWN_TEMPLATE, encoding="utf-8")
    assert main(args[1:]) == 0, capsys.readouterr().err
    assert plan_total_steps(load_preset(PRESET)) == 300  # the hub model is checked on download
