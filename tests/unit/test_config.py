"""The run configuration: defaults, coercion, every rule, YAML round trips, field specs."""

import dataclasses
import json

import pytest

from engine.config import (
    ConfigError,
    EsConfig,
    FieldError,
    LbesConfig,
    RunConfig,
    SamplingConfig,
    config_fields,
)
from engine.fitness import SHAPERS
from engine.schedules import SCHEDULES

BASE = {
    "train_file": "train.parquet",
    "output_dir": "data/runs/out",
    "reward_func_path": "engine.rewards.countdown.compute_score",
}


def make(**options) -> RunConfig:
    return RunConfig.from_flat({**BASE, **options})


def problems(**options) -> dict[str, str]:
    """field -> message of every problem the options have (fails if there is none)."""
    with pytest.raises(ConfigError) as info:
        make(**options)
    return {e.field: e.message for e in info.value.errors}


# --------------------------------------------------------------------------- defaults


def test_defaults_follow_the_reference():
    cfg = make()
    assert cfg.method == "es"
    assert cfg.model.model == "data/models/smollm2-135m-instruct"
    assert (cfg.model.dtype, cfg.model.tensor_parallel_size) == ("bfloat16", 1)
    # the engines are arranged where the run starts (engine/backends/arrangement.py)
    assert (cfg.model.num_engines, cfg.model.engines_per_gpu) == ("auto", "auto")
    assert cfg.model.gpu_memory_utilization is None
    assert (cfg.sampling.n, cfg.sampling.temperature, cfg.sampling.max_tokens) == (1, 0.0, 2048)
    assert (cfg.es.population_size, cfg.es.noise_std, cfg.es.learning_rate) == (32, 1e-3, 5e-7)
    assert (cfg.es.noise_std_scheduler_type, cfg.es.lr_scheduler_type) == ("constant", "constant")
    assert (cfg.es.noise_std_scheduler_rate, cfg.es.lr_scheduler_power) == (0.95, 1.0)
    assert cfg.es.fitness_shaping == "zscore" and not cfg.es.antithetic
    assert (cfg.data.data_batch_size, cfg.data.num_train_epochs, cfg.data.seed) == (64, 3, 42)
    assert cfg.data.max_steps is None and cfg.data.eval_file is None
    assert cfg.lbes == LbesConfig()
    assert (cfg.eval.eval_strategy, cfg.eval.eval_before_train, cfg.eval.save_total_limit) == (
        "no",
        True,
        3,
    )
    assert (cfg.logging.logging_steps, cfg.logging.run_name) == (1, None)
    assert cfg.reward.reward_func_path == "engine.rewards.countdown.compute_score"


def test_lbes_defaults_n_8_and_temperature_1():
    cfg = make(method="lbes")
    assert (cfg.sampling.n, cfg.sampling.temperature) == (8, 1.0)


def test_given_values_beat_method_defaults():
    cfg = make(method="lbes", n=4, temperature=0.7)
    assert (cfg.sampling.n, cfg.sampling.temperature) == (4, 0.7)


def test_field_spec_method_defaults():
    specs = {s.name: s for s in config_fields()}
    assert specs["n"].default_for("lbes") == 8
    assert specs["n"].default_for("es") == 1
    assert specs["temperature"].default_for("lbes") == 1.0
    assert specs["noise_std"].default_for("lbes") == 1e-3


def test_total_steps():
    assert make().total_steps(10) == 30
    assert make(max_steps=7).total_steps(10) == 7


# --------------------------------------------------------------------------- coercion


def test_strings_are_coerced_to_the_field_type():
    cfg = make(
        noise_std="1e-3",
        population_size="8",
        antithetic="true",
        eval_before_train="False",
        max_steps="none",
        eval_file="null",
        learning_rate="0",
        data_batch_size=16.0,
        run_name=2024,
    )
    assert cfg.es.noise_std == 0.001 and isinstance(cfg.es.noise_std, float)
    assert cfg.es.population_size == 8 and isinstance(cfg.es.population_size, int)
    assert cfg.es.antithetic is True
    assert cfg.eval.eval_before_train is False
    assert cfg.data.max_steps is None and cfg.data.eval_file is None
    assert cfg.es.learning_rate == 0.0
    assert cfg.data.data_batch_size == 16 and isinstance(cfg.data.data_batch_size, int)
    assert cfg.logging.run_name == "2024"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("population_size", "eight", "es.population_size must be an integer, got 'eight'"),
        ("population_size", 8.5, "es.population_size must be an integer, got 8.5"),
        ("population_size", True, "es.population_size must be an integer, got True"),
        ("population_size", "none", "es.population_size must be an integer, got 'none'"),
        ("noise_std", "small", "es.noise_std must be a finite number, got 'small'"),
        ("noise_std", "nan", "es.noise_std must be a finite number, got 'nan'"),
        ("antithetic", "maybe", "es.antithetic must be true or false, got 'maybe'"),
        ("antithetic", 2, "es.antithetic must be true or false, got 2"),
        ("model", ["a"], "model.model must be one value (text), got a list of 1 item(s)"),
        ("model", " ", "model.model must not be empty"),
    ],
)
def test_bad_types_are_named(option, value, message):
    assert problems(**{option: value})[option] == message


def test_engine_counts_take_auto_or_a_number_from_text_yaml_and_construction(tmp_path):
    cfg = make(num_engines="AUTO ", engines_per_gpu="4")
    assert (cfg.model.num_engines, cfg.model.engines_per_gpu) == ("auto", 4)
    assert make(num_engines=2).with_overrides(["num_engines=auto"]).model.num_engines == "auto"
    path = tmp_path / "run.yaml"
    path.write_text(make(engines_per_gpu=2).to_yaml())
    text = path.read_text()
    assert "num_engines: auto" in text and "engines_per_gpu: 2" in text
    assert RunConfig.from_yaml(path) == make(engines_per_gpu=2)
    direct = dataclasses.replace(make().model, num_engines=3)
    assert RunConfig(model=direct, data=make().data, reward=make().reward).model.num_engines == 3
    assert [s.words for s in config_fields() if s.name in ("num_engines", "engines_per_gpu")] == [
        ("auto",),
        ("auto",),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("many", "model.num_engines must be an integer or auto, got 'many'"),
        (0, "model.num_engines must be >= 1, got 0"),
        (2.5, "model.num_engines must be an integer or auto, got 2.5"),
        ("none", "model.num_engines must be an integer or auto, got 'none'"),
    ],
)
def test_bad_engine_counts_are_named(value, message):
    assert problems(num_engines=value)["num_engines"] == message


# --------------------------------------------------------------------------- ranges, choices


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("noise_std", -1, "es.noise_std must be > 0, got -1"),
        ("noise_std", 0, "es.noise_std must be > 0, got 0"),
        ("population_size", 1, "es.population_size must be >= 2, got 1"),
        ("temperature", -0.5, "sampling.temperature must be >= 0, got -0.5"),
        ("learning_rate", -1e-7, "es.learning_rate must be >= 0, got -1e-07"),
        ("gpu_memory_utilization", 0, "model.gpu_memory_utilization must be > 0, got 0"),
        ("gpu_memory_utilization", 1.5, "model.gpu_memory_utilization must be <= 1, got 1.5"),
        ("noise_std_scheduler_rate", 1.2, "es.noise_std_scheduler_rate must be <= 1, got 1.2"),
        ("save_total_limit", 0, "eval.save_total_limit must be >= 1, got 0"),
        ("eval_steps", 0, "eval.eval_steps must be >= 1, got 0"),
    ],
)
def test_ranges(option, value, message):
    # messages show the value as converted (ints given for float options print as floats)
    got = problems(**{option: value})[option]
    assert got.replace(".0", "") == message.replace(".0", "")


def test_range_message_shows_value_rule_and_field():
    assert problems(noise_std=-1.5)["noise_std"] == "es.noise_std must be > 0, got -1.5"


def test_choices_are_checked_with_a_suggestion():
    msg = problems(lr_scheduler_type="cosin")["lr_scheduler_type"]
    assert msg == (
        "es.lr_scheduler_type must be one of constant, linear, cosine, exponential, "
        "polynomial, got 'cosin': did you mean 'cosine'?"
    )
    assert "centered_rank" in problems(fitness_shaping="ranks")["fitness_shaping"]
    assert "must be one of es, lbes" in problems(method="pbes")["method"]
    assert problems(eval_strategy="step")["eval_strategy"].endswith("did you mean 'steps'?")
    assert "must be a string, got False" in problems(eval_strategy=False)["eval_strategy"]


def test_choices_come_from_the_registries():
    specs = {s.name: s for s in config_fields()}
    assert specs["fitness_shaping"].choices == tuple(SHAPERS)
    assert specs["noise_std_scheduler_type"].choices == tuple(SCHEDULES)
    assert specs["lr_scheduler_type"].choices == tuple(SCHEDULES)


def test_learning_rate_zero_is_allowed():
    assert make(learning_rate=0).es.learning_rate == 0.0


# --------------------------------------------------------------------------- required, unknown


def test_required_fields():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_flat({})
    fields = {e.field for e in info.value.errors}
    assert fields == {"train_file", "output_dir", "reward_func_path"}
    assert "data.train_file is required" in str(info.value)


def test_unknown_option_suggests_the_closest_name():
    errs = problems(noise_sdt=0.1)
    assert errs["noise_sdt"] == "unknown option 'noise_sdt': did you mean 'noise_std'?"
    assert "did you mean" not in problems(zzzz=1)["zzzz"]


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_flat({"noise_sdt": 1, "population_size": 1, "temperature": -1})
    fields = [e.field for e in info.value.errors]
    assert set(fields) == {
        "noise_sdt",
        "population_size",
        "temperature",
        "train_file",
        "output_dir",
        "reward_func_path",
    }
    assert str(info.value).startswith("invalid configuration (6 problems):\n  - ")
    assert all(isinstance(e, FieldError) for e in info.value.errors)


def test_a_rule_on_an_invalid_field_is_not_reported_twice():
    # eval_strategy is invalid, so the eval_file rule (which reads it) stays silent
    assert set(problems(eval_strategy="sometimes")) == {"eval_strategy"}


# --------------------------------------------------------------------------- cross-field rules

LBES = {"method": "lbes"}


@pytest.mark.parametrize(
    ("options", "field", "text"),
    [
        ({"antithetic": True, "population_size": 31}, "population_size", "must be even"),
        (
            {"eval_strategy": "steps", "eval_file": "e.parquet"},
            "eval_steps",
            "eval.eval_steps must be >= 1 when eval_strategy is 'steps', got None",
        ),
        (
            {"save_strategy": "steps"},
            "save_steps",
            "eval.save_steps must be >= 1 when save_strategy is 'steps', got None",
        ),
        (
            {"eval_strategy": "epoch"},
            "eval_file",
            "data.eval_file is required when eval_strategy is 'epoch'",
        ),
        ({**LBES, "n": 1}, "n", "sampling.n must be >= 2 for lbes per-prompt correlation, got 1"),
        ({**LBES, "temperature": 0}, "temperature", "must be > 0 for lbes per-prompt correlation"),
        (
            {**LBES, "top_k_rewards": 9},
            "top_k_rewards",
            "lbes.top_k_rewards must be <= sampling.n (8), got 9",
        ),
        ({**LBES, "bottom_k_rewards": 9}, "bottom_k_rewards", "must be <= sampling.n (8)"),
        (
            {**LBES, "top_k_prompt_reward_var": 65},
            "top_k_prompt_reward_var",
            "must be <= data.data_batch_size (64), got 65",
        ),
        (
            {**LBES, "flat_top_k_rewards": 513},
            "flat_top_k_rewards",
            "must be <= data_batch_size * n (512)",
        ),
        ({**LBES, "flat_bottom_k_rewards": 513}, "flat_bottom_k_rewards", "(512)"),
        ({**LBES, "top_k_rewards": 1}, "top_k_rewards", "per-prompt correlation needs 2"),
        (
            {**LBES, "n": 1, "flat_corrcoef": True, "data_batch_size": 1},
            "data_batch_size",
            "data.data_batch_size * sampling.n must be >= 2 for lbes, got 1 * 1",
        ),
        ({**LBES, "macro_advantage": True}, "macro_advantage", "only applies to method 'es'"),
        (
            {"top_k_rewards": 2},
            "top_k_rewards",
            "lbes.top_k_rewards only applies to method 'lbes', got 2 with method 'es'",
        ),
        ({"flat_corrcoef": True}, "flat_corrcoef", "only applies to method 'lbes'"),
        ({"reward_func_path": "compute_score"}, "reward_func_path", "must be a dotted path"),
        (
            {"reward_func_path": "os.system"},
            "reward_func_path",
            "reward.reward_func_path 'os.system' is not in an allowed place",
        ),
        (
            {
                "reward_source": "ensemble",
                "reward_func_path": None,
                "ensemble_members": "engine.rewards.gsm8k.compute_score,subprocess.run",
            },
            "ensemble_members",
            "add 'subprocess' (or the folder that holds its file) to ESLAB_REWARD_MODULES",
        ),
    ],
)
def test_cross_field_rules(options, field, text):
    errs = problems(**options)
    assert field in errs, errs
    assert text in errs[field]


@pytest.mark.parametrize(
    "options",
    [
        {"antithetic": True, "population_size": 32},
        {"eval_strategy": "steps", "eval_steps": 5, "eval_file": "e.parquet"},
        {"save_strategy": "steps", "save_steps": 5},
        {"save_strategy": "epoch"},
        {**LBES, "n": 1, "flat_corrcoef": True},
        {**LBES, "temperature": 0, "flat_corrcoef": True},
        {
            **LBES,
            "top_k_rewards": 1,
            "bottom_k_rewards": 1,
            "top_k_prompt_reward_var": 64,
            "flat_top_k_rewards": 512,
            "exclude_same_rewards_samples": True,
        },
        {**LBES, "top_k_rewards": 1, "flat_corrcoef": True},
        {**LBES, "antithetic": True},
    ],
)
def test_valid_combinations_pass(options):
    make(**options)


# --------------------------------------------------------------------------- nested, overrides


def test_nested_and_dotted_input():
    cfg = RunConfig.from_flat(
        {
            "method": "lbes",
            "data": {"train_file": "t", "output_dir": "data/runs/o"},
            "reward.reward_func_path": "engine.rewards.gsm8k.compute_score",
            "model": {"model": "org/m"},
            "es": {"noise_std": 0.01},
            "top_k_rewards": 2,
        }
    )
    assert (cfg.data.train_file, cfg.model.model, cfg.es.noise_std) == ("t", "org/m", 0.01)
    assert cfg.reward.reward_func_path == "engine.rewards.gsm8k.compute_score"
    assert cfg.lbes.top_k_rewards == 2
    # `model` given flat is the option, not the group
    assert make(model="other/model").model.model == "other/model"


def test_nested_option_in_the_wrong_group():
    errs = problems(es={"n": 3})
    assert errs["n"] == "es.n is not an option of group 'es': write sampling.n or just n"


def test_option_given_twice():
    assert problems(n=2, sampling={"n": 3})["n"] == "sampling.n is given twice: keep one"


def test_group_without_a_mapping():
    assert "'es' is a group" in problems(es=3)["es"]


def test_with_overrides():
    cfg = make()
    new = cfg.with_overrides(
        [
            "noise_std=2e-3",
            "es.population_size=8",
            "antithetic=true",
            "eval_file=",
            "method=lbes",
            "n=4",
            "temperature=0.5",
        ]
    )
    assert (new.es.noise_std, new.es.population_size, new.es.antithetic) == (2e-3, 8, True)
    assert (new.method, new.sampling.n, new.sampling.temperature) == ("lbes", 4, 0.5)
    # the other values are kept, the original is untouched
    assert new.data.train_file == "train.parquet" and new.sampling.max_tokens == 2048
    assert cfg.es.noise_std == 1e-3


def test_with_overrides_keeps_current_values_over_method_defaults():
    # n=1 and temperature 0 stay: the method defaults apply only to options never given
    with pytest.raises(ConfigError, match=r"sampling.n must be >= 2 for lbes"):
        make().with_overrides(["method=lbes"])


def test_with_overrides_errors():
    with pytest.raises(ConfigError) as info:
        make().with_overrides(["noise_std", "noise_sdt=1", "population_size=1"])
    errs = {e.field: e.message for e in info.value.errors}
    assert errs["noise_std"] == (
        "override 'noise_std' must look like option=value, e.g. noise_std=1e-3"
    )
    assert "did you mean 'noise_std'" in errs["noise_sdt"]
    assert errs["population_size"] == "es.population_size must be >= 2, got 1"


# --------------------------------------------------------------------------- round trips


@pytest.fixture
def rich() -> RunConfig:
    return make(
        method="lbes",
        n=4,
        top_k_rewards=1,
        bottom_k_rewards=1,
        eval_strategy="steps",
        eval_steps=5,
        eval_file="e.parquet",
        noise_std=2e-3,
        lr_scheduler_type="cosine",
        max_steps=10,
        run_name="no",
        gpu_memory_utilization=0.3,
    )


def test_flat_and_nested_round_trip(rich):
    assert RunConfig.from_flat(rich.to_flat()) == rich
    assert RunConfig.from_flat(rich.to_dict()) == rich
    assert RunConfig.from_flat(json.loads(json.dumps(rich.to_flat()))) == rich
    assert list(rich.to_flat()) == [s.name for s in config_fields()]
    assert rich.to_dict()["lbes"]["top_k_rewards"] == 1


def test_yaml_round_trip(rich, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(rich.to_yaml())
    assert RunConfig.from_yaml(path) == rich
    assert "# es: " in rich.to_yaml()


def test_handwritten_yaml_flat_and_nested(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "method: lbes\ntrain_file: t.parquet\noutput_dir: data/runs/out\n"
        "reward_func_path: engine.rewards.gsm8k.compute_score\n"
        "noise_std: 1e-3\neval_strategy: no\nsave_strategy: epoch\n"
        "flat_corrcoef: true\n"
    )
    cfg = RunConfig.from_yaml(flat)
    assert cfg.es.noise_std == 0.001  # YAML 1.1 reads 1e-3 as a string
    assert cfg.eval.eval_strategy == "no"  # ... and `no` as false: both handled
    assert cfg.lbes.flat_corrcoef is True and cfg.sampling.n == 8

    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "method: lbes\ndata:\n  train_file: t.parquet\n  output_dir: data/runs/out\n"
        "reward:\n  reward_func_path: engine.rewards.gsm8k.compute_score\n"
        "es:\n  noise_std: 1.0e-3\neval:\n  save_strategy: epoch\n"
        "lbes:\n  flat_corrcoef: true\n"
    )
    assert RunConfig.from_yaml(nested) == cfg


def test_yaml_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: es\ntrain_file: t.parquet\noutput_dir: out: x\n")
    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(bad)
    assert f"{bad}:3:16: YAML syntax error: mapping values are not allowed here" in str(info.value)

    with pytest.raises(ConfigError, match=r"cannot read .*missing.yaml"):
        RunConfig.from_yaml(tmp_path / "missing.yaml")

    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"must hold a mapping of option: value pairs, got a"):
        RunConfig.from_yaml(listing)

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("population_size: 1\n")
    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(invalid)
    assert info.value.source == str(invalid)
    assert str(info.value).startswith(f"invalid configuration in {invalid} (4 problems)")


def test_empty_yaml_reports_required_fields(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(empty)
    assert {e.field for e in info.value.errors} == {"train_file", "output_dir", "reward_func_path"}


# --------------------------------------------------------------------------- construction, specs


def test_direct_construction_is_validated():
    with pytest.raises(ConfigError) as info:
        RunConfig()
    assert {e.field for e in info.value.errors} == {"train_file", "output_dir", "reward_func_path"}
    cfg = make()
    with pytest.raises(ConfigError, match=r"es.population_size must be of type int, got '8'"):
        dataclasses.replace(cfg, es=EsConfig(population_size="8"))
    with pytest.raises(ConfigError, match=r"sampling.n must be >= 2 for lbes"):
        dataclasses.replace(cfg, method="lbes", sampling=SamplingConfig(n=1, temperature=1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.es.noise_std = 1.0  # type: ignore[misc]


def test_config_fields_cover_every_field_once():
    specs = config_fields()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    from_dataclasses = {"method"} | {
        f.name
        for group in dataclasses.fields(RunConfig)
        if group.name != "method"
        for f in dataclasses.fields(group.default_factory())
    }
    assert set(names) == from_dataclasses
    assert names[0] == "method"
    for spec in specs:
        assert spec.help, spec.name
        assert spec.type in (str, int, float, bool), spec.name
        # reward_func_path is required by a rule (unless reward_source is scorer/ensemble)
        assert spec.required == (spec.name in BASE and spec.name != "reward_func_path"), spec.name
        if spec.required:
            assert not spec.nullable
    by_name = {s.name: s for s in specs}
    assert by_name["noise_std"].path == "es.noise_std"
    assert (by_name["noise_std"].min, by_name["noise_std"].exclusive_min) == (0.0, True)
    assert by_name["max_steps"].nullable and by_name["max_steps"].type is int
    assert by_name["eval_strategy"].choices == ("no", "steps", "epoch")
    assert by_name["gpu_memory_utilization"].max == 1.0
    assert by_name["model"].group == "model" and by_name["method"].group == ""
    assert by_name["top_k_rewards"].methods == ("lbes",)
    assert by_name["macro_advantage"].methods == ("es",)
    assert by_name["noise_std"].methods == ("es", "lbes")
