"""Bad input is refused cheaply and clearly: YAML that costs more to read than a configuration
needs, values of the wrong shape, output folders outside the allowed roots, unsafe run names,
impossible model names, malformed model manifests and bad ports. Each refusal names the
field, file or setting and says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.forms import parse_yaml
from engine.config import ConfigError, RunConfig, read_yaml
from engine.config.yaml_io import MAX_YAML_BYTES
from engine.model_files import MANIFEST_NAME, ModelError, check_model_dir, default_model_is_ready
from engine.paths import PROJECT_ROOT, data_dir, default_model_dir, resolve_path

REQUIRED = {
    "train_file": "t.parquet",
    "output_dir": "data/runs/out",
    "reward_func_path": "engine.rewards.conciseness.compute_score",
}
BILLION_LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)


def problems(**options) -> dict[str, str]:
    try:
        RunConfig.from_flat({**REQUIRED, **options})
    except ConfigError as exc:
        return {e.field: e.message for e in exc.errors}
    return {}


def the_error(text: str | bytes, source: str = "the imported YAML") -> str:
    with pytest.raises(ConfigError) as info:
        read_yaml(text, source)
    [error] = info.value.errors
    assert error.field == "config"
    return error.message


# --------------------------------------------------------------------------- YAML


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BILLION_LAUGHS, "the imported YAML:1:4: YAML refused: anchors and aliases"),
        ("base: &b {n: 2}\nsampling: *b\n", "the imported YAML:1:7: YAML refused: anchors"),
        ("es:\n  <<: *x\n", "the imported YAML:2:7: YAML refused: anchors and aliases"),
        ("a: " + "[" * 5000 + "]" * 5000, "the imported YAML:1:11: YAML refused: nesting deeper"),
        ("seed: " + "9" * 5000, "the imported YAML: YAML refused: a value cannot be read"),
    ],
)
def test_yaml_that_expands_or_recurses_is_refused_while_composing(text, message):
    assert the_error(text).startswith(message)


def test_oversized_yaml_is_refused_before_it_is_parsed(monkeypatch, tmp_path):
    def no_parse(*args, **kwargs):
        raise AssertionError("an oversized document was parsed")

    monkeypatch.setattr(yaml, "load", no_parse)
    big = "run_name: x\n" + "# padding\n" * (MAX_YAML_BYTES // 10)
    assert the_error(big.encode()) == (
        "the imported YAML is larger than 1048576 bytes (1 MiB), the most a run configuration "
        "may have"
    )
    file = tmp_path / "big.yaml"
    file.write_text(big)
    with pytest.raises(ConfigError, match=rf"{file} is larger than 1048576 bytes"):
        RunConfig.from_yaml(file)


def test_the_cli_refuses_a_billion_laughs_file_in_one_line(capsys, tmp_path):
    file = tmp_path / "laughs.yaml"
    file.write_text(BILLION_LAUGHS)
    assert main(["submit", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{file}:1:4: YAML refused: anchors and aliases" in err


def test_the_form_import_refuses_aliases_and_non_scalar_values():
    with pytest.raises(ConfigError, match="the imported YAML:1:4: YAML refused: anchors"):
        parse_yaml(BILLION_LAUGHS.encode(), "the imported YAML")
    with pytest.raises(ConfigError) as info:
        parse_yaml(b"learning_rate: [1, 2]\nrun_name: {a: 1}\n", "run.yaml")
    assert {e.field: e.message for e in info.value.errors} == {
        "learning_rate": "es.learning_rate must be one value (a number), got a list of 2 item(s)",
        "run_name": "logging.run_name must be one value (text), got a mapping of 1 key(s)",
    }


# --------------------------------------------------------------------------- value shapes


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("learning_rate", [1e-3], "es.learning_rate must be one value (a number), got a list"),
        ("learning_rate", {"a": 1}, "es.learning_rate must be one value (a number), got a mapping"),
        ("run_name", {"a": 1}, "logging.run_name must be one value (text), got a mapping"),
        ("antithetic", [True], "es.antithetic must be one value (true or false), got a list"),
        ("population_size", {2, 4}, "es.population_size must be one value (an integer), got"),
        ("run_name", yaml.safe_load("d: 2024-01-01")["d"], "logging.run_name must be one value"),
        ("seed", 10**30, "data.seed must be at most 9223372036854775807 (2**63 - 1)"),
        ("population_size", "1e30", "es.population_size must be at most 9223372036854775807"),
        ("learning_rate", 10**400, "es.learning_rate must be a finite number"),
    ],
)
def test_values_of_the_wrong_shape_are_refused_naming_the_field(option, value, message):
    assert problems(**{option: value})[option].startswith(message)


def test_integers_are_taken_exactly():
    assert RunConfig.from_flat({**REQUIRED, "seed": 2**62 + 1}).data.seed == 2**62 + 1


# --------------------------------------------------------------------------- output_dir


@pytest.fixture
def data_folder(tmp_path, monkeypatch) -> Path:
    """A data folder of its own (ESLAB_DATA_DIR), no other output roots."""
    folder = tmp_path / "data"
    (folder / "runs").mkdir(parents=True)
    monkeypatch.setenv("ESLAB_DATA_DIR", str(folder))
    monkeypatch.delenv("ESLAB_OUTPUT_ROOTS")
    return folder


def test_output_dir_inside_the_data_folder_is_accepted(data_folder):
    assert problems(output_dir=str(data_folder / "runs" / "a")) == {}
    assert problems(output_dir=str(data_folder / "runs" / ".." / "b")) == {}
    assert problems(output_dir="data/runs/preset") == {}  # where presets write: data moved too


@pytest.mark.parametrize(
    ("output_dir", "why"),
    [
        ("out", "is not a folder inside the data folder"),  # the project folder
        ("{project}/data/runs/x", "is not a folder inside the data folder"),  # not ours
        ("{data}", "is not a folder inside the data folder"),  # the root itself
        ("{data}/runs/../../escape", "is not a folder inside the data folder"),
        ("{data}/link/run", "is not a folder inside the data folder"),  # a symlink out
        ("/etc/eslab", "is not a folder inside the data folder"),
        ("~/.ssh", "is not a folder inside the data folder"),
        ("{data}/models/smollm2-135m-instruct/out", "lies in the model folder"),
        ("{data}/models", "is, holds or lies in the model folder"),
        ("{data}/a\0b", "is not a usable path"),
    ],
)
def test_output_dir_outside_the_roots_or_on_a_model_is_refused(data_folder, output_dir, why):
    (data_folder / "link").symlink_to(data_folder.parent)
    output_dir = output_dir.replace("{data}", str(data_folder))
    message = problems(output_dir=output_dir.replace("{project}", str(PROJECT_ROOT)))["output_dir"]
    assert message.startswith("data.output_dir ") and why in message


def test_output_dir_in_the_run_models_folder_is_refused(data_folder):
    model = data_folder / "my-model"
    model.mkdir()
    message = problems(model=str(model), output_dir=str(model / "run"))["output_dir"]
    assert f"which is, holds or lies in the model folder {model}" in message


def test_output_roots_widen_but_never_open_the_project(data_folder, monkeypatch, tmp_path):
    monkeypatch.setenv("ESLAB_OUTPUT_ROOTS", f"{tmp_path / 'elsewhere'}:/")
    assert problems(output_dir=str(tmp_path / "elsewhere" / "run")) == {}
    for inside_the_project in (PROJECT_ROOT / "engine" / "x", PROJECT_ROOT / "data" / "runs"):
        assert (
            "is not a folder inside the data folder"
            in problems(output_dir=str(inside_the_project))["output_dir"]
        )
    assert "holds the project folder" in problems(output_dir=str(PROJECT_ROOT.parent))["output_dir"]


def test_presets_and_the_readme_example_write_inside_the_data_folder():
    """The default data folder is where presets write (data/runs/NAME)."""
    from engine.presets import load_preset, preset_names

    for name in preset_names():
        out = resolve_path(load_preset(name).data.output_dir)
        assert out.resolve().is_relative_to(data_dir().resolve())


# --------------------------------------------------------------------------- run names


@pytest.mark.parametrize(
    "name",
    [
        "![x](http://evil.example/x.png)",
        "<script>alert(1)</script>",
        "a/b",
        "../up",
        " leading",
        "trailing ",
        "line\nbreak",
        "tab\there",
        "x" * 101,
        "right-to-left\u202eoverride",
    ],
)
def test_unsafe_run_names_are_refused(name):
    assert problems(run_name=name)["run_name"].startswith("logging.run_name must be 1 to 100")


@pytest.mark.parametrize("name", ["es countdown-1.2_x", "実験1", "_x", "x" * 100])
def test_plain_run_names_are_accepted(name):
    assert problems(run_name=name) == {}


def test_a_run_name_given_apart_from_the_configuration_is_checked_too():
    from jobs.planning import plan_run

    config = RunConfig.from_flat(REQUIRED)
    with pytest.raises(ConfigError, match=r"the run name must be 1 to 100 letters"):
        plan_run(config, name="[click](http://evil.example)")


def test_the_default_run_name_is_safe_whatever_the_dataset_folder():
    from engine.config.rules import run_name_problem
    from jobs.planning import default_run_name

    config = RunConfig.from_flat({**REQUIRED, "train_file": "data/my task (v2)!/t.parquet"})
    name = default_run_name(config)
    assert name.startswith("es-my-task-v2-") and run_name_problem(name) is None


# --------------------------------------------------------------------------- model names


@pytest.mark.parametrize(
    "model", ["not a model", "org/na me", "org//x", "-org/x", "org/x--y", "org/x..y", "gpt2"]
)
def test_a_model_that_is_neither_a_folder_nor_a_hub_id_is_refused(model):
    message = problems(model=model)["model"]
    assert message.startswith(f"model.model {model!r} is neither a folder here nor a Hugging")


@pytest.mark.parametrize(
    "model", ["HuggingFaceTB/SmolLM2-135M-Instruct", "data/models/not-fetched-yet", "./m"]
)
def test_hub_ids_and_folder_paths_are_accepted(model):
    assert problems(model=model) == {}


def test_resolving_an_impossible_model_name_never_asks_the_hub(monkeypatch):
    import huggingface_hub

    from engine.model_files import resolve_model

    def ask(repo_id, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", ask)
    with pytest.raises(ModelError, match=r"model 'a b' is neither a folder here nor a Hugging"):
        resolve_model("a b")


def model_folder(folder: Path, manifest: str | bytes) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    (folder / "tokenizer.json").write_text("{}")
    data = manifest.encode() if isinstance(manifest, str) else manifest
    (folder / MANIFEST_NAME).write_bytes(data)
    return folder


SHA = "0" * 64


@pytest.mark.parametrize(
    ("manifest", "what"),
    [
        ("{not json", "is not a readable JSON manifest"),
        (b"\xff\xfe", "is not a readable JSON manifest"),
        ("[1, 2]", "must be a JSON object whose `files` maps file names"),
        ('{"files": ["config.json"]}', "must be a JSON object whose `files` maps file names"),
        ('{"files": {}}', "must be a JSON object whose `files` maps file names"),
        (json.dumps({"files": {"../../../etc/passwd": SHA}}), "only files directly in the folder"),
        (json.dumps({"files": {"/dev/zero": SHA}}), "only files directly in the folder"),
        (json.dumps({"files": {"config.json": 5}}), "a checksum that is not 64 hex digits"),
        (json.dumps({"files": {"config.json": "abc"}}), "a checksum that is not 64 hex digits"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_file(tmp_path, manifest, what):
    folder = model_folder(tmp_path / "m", manifest)
    with pytest.raises(ModelError) as info:
        check_model_dir(folder)
    assert str(info.value).startswith(f"{folder / MANIFEST_NAME} ")
    assert what in str(info.value)
    assert not default_model_is_ready(folder)


def test_the_cli_reports_a_malformed_manifest_in_one_line(capsys, tmp_path):
    folder = model_folder(tmp_path / "m", "[]")
    assert main(["model", "check", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{folder / MANIFEST_NAME} must be a JSON" in err


def test_a_default_model_folder_with_a_bad_manifest_says_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    folder = default_model_dir()
    folder.parent.mkdir(parents=True)
    model_folder(folder, "{")
    with pytest.raises(ModelError, match="eslab model fetch-default"):
        check_model_dir(folder)


# --------------------------------------------------------------------------- ports and URLs


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("http://127.0.0.1:99999", "has port '99999': a port is a number from 1 to 65535"),
        ("http://127.0.0.1:0", "has port '0'"),
        ("http://127.0.0.1:80a", "has port '80a'"),
        ("http://[::1]:70000", "has port '70000'"),
        ("http://127.0.0.1:８０", "has port '８０'"),
        ("ftp://127.0.0.1:21", "must start with http:// or https://"),
        ("http://:8000", "names no host"),
        ("http://[::1", "is not a URL"),
    ],
)
def test_a_bad_scorer_url_is_one_line_naming_the_field(url, what):
    assert problems(scorer_url=url)["scorer_url"].startswith(f"alignment.scorer_url {what}")


def test_a_bad_port_in_an_ensemble_member_url_names_the_field():
    errors = problems(
        reward_source="ensemble",
        reward_func_path=None,
        ensemble_members="engine.rewards.conciseness.compute_score,http://h:123456",
    )
    assert errors["ensemble_members"] == (
        "ensemble.ensemble_members: a URL has port '123456': a port is a number from 1 to 65535"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["serve", "--port", "99999"], "argument --port: '99999' is no port"),
        (["scorer", "serve", "--port", "-1"], "argument --port: '-1' is no port"),
        (["bon", "1", "--gold", "http://h:65536"], "argument --gold: the scorer URL has port"),
    ],
)
def test_bad_ports_on_the_command_line_are_named(capsys, argv, line):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert line in capsys.readouterr().err


PORT_RULE = "a port is a number from 1 to 65535"


@pytest.mark.parametrize(
    ("address", "line"),
    [
        ("127.0.0.1:99999", f"RAY_ADDRESS has port '99999': {PORT_RULE}"),
        ("ray://head:100010", f"RAY_ADDRESS has port '100010': {PORT_RULE}"),
        ("http://head:x", f"RAY_ADDRESS has port 'x': {PORT_RULE}"),
        ("tcp://head:6379", "RAY_ADDRESS must start with ray:// or http:// or https://"),
    ],
)
def test_a_bad_ray_address_stops_serve_in_one_line(capsys, monkeypatch, address, line):
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == f"eslab: error: {line}\n"


def test_a_bad_dashboard_url_setting_is_said_in_place_of_the_link(monkeypatch):
    from app.cli.common import dashboard_url

    monkeypatch.setenv("ESLAB_DASHBOARD_URL", "http://lab:8o8o")
    assert dashboard_url(3) == (
        "(no dashboard link: ESLAB_DASHBOARD_URL has port '8o8o': a port is a number from 1 "
        "to 65535)"
    )
