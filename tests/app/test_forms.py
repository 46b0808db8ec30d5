"""The form's YAML import reads files the way `eslab train` does, through engine.config."""

import pytest

from app.forms import parse_tags, parse_yaml
from engine.config import ConfigError, RunConfig


def test_import_reads_flat_nested_and_dotted_keys_typed_like_the_cli(tmp_path):
    text = (
        "method: lbes\neval_strategy: no\nes:\n  noise_std: 0.0042\n"
        "lbes.flat_corrcoef: true\nrun_name: 2024\n"
    )
    assert parse_yaml(text) == {
        "method": "lbes",
        "eval_strategy": "no",
        "noise_std": 0.0042,
        "flat_corrcoef": True,
        "run_name": 2024,
    }
    path = tmp_path / "run.yaml"
    path.write_text(
        text + "train_file: t.parquet\noutput_dir: data/runs/out\n"
        "reward_func_path: engine.rewards.gsm8k.compute_score\n"
    )
    assert RunConfig.from_flat(parse_yaml(path.read_bytes())) == RunConfig.from_yaml(path)


def test_the_pages_tags_are_split_at_commas_trimmed_and_each_kept_once():
    assert parse_tags(" night, lr-search ,, night,  ") == ["night", "lr-search"]
    assert parse_tags("") == [] and parse_tags(" , ") == []


def test_import_leaves_out_options_the_form_has_no_widget_for():
    assert parse_yaml("noise_sdt: 1\nseed: 3\n") == {"seed": 3}


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "method: es\noutput_dir: out: x\n",
            "run.yaml:2:16: YAML syntax error: mapping values are not allowed here",
        ),
        ("- a\n- b\n", "run.yaml must hold a mapping of option: value pairs, got a list"),
        (b"seed: \xff\n", "run.yaml is not UTF-8 text: "),
    ],
)
def test_import_errors_name_the_file_as_the_cli_does(content, message):
    with pytest.raises(ConfigError) as info:
        parse_yaml(content, "run.yaml")
    assert [e.field for e in info.value.errors] == ["config"]
    assert info.value.errors[0].message.startswith(message)
    assert info.value.source == "run.yaml"
