"""A sweep's definition: the space file read against the schema, every error naming its
field, the runs checked against the base configuration, and the round trip through JSON and
YAML."""

from __future__ import annotations

import json

import pytest
import yaml

from engine.config import RunConfig
from jobs.sweeps import Parameter, SweepSpec, SweepSpecError, grid_option, parse_space, trial_config
from jobs.sweeps.spec import grid_points

BASE = RunConfig.from_flat(
    {
        "train_file": "train.parquet",
        "output_dir": "data/runs/out",
        "reward_func_path": "engine.rewards.countdown.compute_score",
    }
)
EVALUATING = BASE.with_overrides(["eval_file=eval.parquet", "eval_strategy=steps", "eval_steps=5"])
OBJECTIVE = {"metric": "train/reward/mean"}
# the contract's example, on a base that evaluates
EXAMPLE = {
    "method": "random",
    "budget": 12,
    "parallel": 2,
    "seed": 0,
    "objective": {"metric": "eval/reward/mean", "mode": "max", "summary": "last"},
    "early_stopping": {
        "rule": "median",
        "metric": "eval/reward/mean",
        "min_step": 5,
        "min_runs": 3,
    },
    "parameters": {
        "noise_std": {"low": 0.0005, "high": 0.005, "log": True},
        "learning_rate": {"values": [0.0005, 0.001, 0.002]},
        "population_size": {"values": [8, 16]},
    },
}


def space(**keys) -> dict:
    """A grid over seeds, with `keys` replacing its keys (None removes one)."""
    mapping = {"objective": OBJECTIVE, "parameters": {"seed": {"values": [1, 2]}}, **keys}
    return {k: v for k, v in mapping.items() if v is not None}


def refused(mapping, base: RunConfig = BASE) -> SweepSpecError:
    with pytest.raises(SweepSpecError) as info:
        parse_space(mapping, base)
    return info.value


# --------------------------------------------------------------------------- what parses


def test_the_contracts_example_parses_with_typed_values():
    spec = parse_space(EXAMPLE, EVALUATING)
    noise, lr, population = spec.parameters
    assert (spec.method, spec.budget, spec.parallel, spec.seed) == ("random", 12, 2, 0)
    assert noise == Parameter("noise_std", low=0.0005, high=0.005, log=True, integer=False)
    assert lr.values == (0.0005, 0.001, 0.002) and not lr.integer
    assert population.values == (8, 16) and population.integer
    assert spec.objective.metric == "eval/reward/mean"
    assert spec.early_stopping.rule == "median" and spec.early_stopping.min_step == 5


def test_defaults():
    spec = parse_space(
        {"parameters": {"seed": {"values": [1, 2, 3]}}, "objective": {"metric": "time/step"}},
        BASE,
    )
    assert (spec.method, spec.budget, spec.parallel, spec.seed) == ("grid", 3, 2, 0)
    assert (spec.objective.mode, spec.objective.summary) == ("max", "last")
    assert spec.early_stopping is None
    stopping = parse_space(space(early_stopping={"rule": "halving"}), BASE).early_stopping
    assert (stopping.metric, stopping.min_step, stopping.min_runs, stopping.eta) == (
        "train/reward/mean",
        1,
        3,
        3,
    )


def test_text_as_yaml_and_the_cli_write_it_is_coerced_by_the_schema():
    spec = parse_space(
        space(
            method="random",
            budget="4",
            parameters={
                "noise_std": {"low": "1e-4", "high": "1e-2", "log": "true"},
                "antithetic": {"values": ["true", "false"]},
                "max_steps": {"values": ["none", "10"]},
            },
        ),
        BASE,
    )
    noise, antithetic, steps = spec.parameters
    assert (noise.low, noise.high, noise.log, spec.budget) == (1e-4, 1e-2, True, 4)
    assert antithetic.values == (True, False) and steps.values == (None, 10)


def test_the_objective_may_be_written_as_text():
    objective = parse_space(space(objective="train/reward/mean : min"), BASE).objective
    assert (objective.metric, objective.mode) == ("train/reward/mean", "min")
    assert parse_space(space(objective="eval/accuracy/mean"), EVALUATING).objective.mode == "max"


def test_a_grid_takes_every_integer_of_an_integer_range_in_a_fixed_order():
    spec = parse_space(
        space(parameters={"seed": {"low": 0, "high": 2}, "antithetic": {"values": [True, False]}}),
        BASE,
    )
    assert spec.budget == 6
    assert list(grid_points(spec.parameters)) == [
        {"seed": s, "antithetic": a} for s in (0, 1, 2) for a in (True, False)
    ]


def test_a_smaller_budget_checks_and_runs_only_the_first_grid_points():
    # population_size 9 would be refused with antithetic, but the budget never reaches it
    antithetic = BASE.with_overrides(["antithetic=true"])
    spec = parse_space(
        space(budget=1, parameters={"population_size": {"values": [8, 9]}}), antithetic
    )
    assert spec.budget == 1
    assert refused(space(parameters={"population_size": {"values": [8, 9]}}), antithetic)


@pytest.mark.parametrize("extra", [{}, {"rule": "halving", "eta": 4}])
def test_to_dict_round_trips_through_json_and_yaml(extra):
    mapping = {**EXAMPLE, "early_stopping": {**EXAMPLE["early_stopping"], **extra}}
    mapping["parameters"] = {**mapping["parameters"], "seed": {"low": 0, "high": 9}}
    spec = parse_space(mapping, EVALUATING)
    assert SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert SweepSpec.from_dict(yaml.safe_load(spec.to_yaml())) == spec
    assert list(spec.to_dict()["parameters"]) == [
        "noise_std",
        "learning_rate",
        "population_size",
        "seed",
    ]


def test_trial_config_is_the_base_with_the_parameters_set():
    config = trial_config(BASE, {"noise_std": 0.002, "population_size": 8})
    assert (config.es.noise_std, config.es.population_size) == (0.002, 8)
    assert config.data.train_file == BASE.data.train_file


def test_grid_option_reads_the_clis_text_with_the_options_types():
    assert grid_option("population_size=8,16", BASE) == Parameter(
        "population_size", values=(8, 16), integer=True
    )
    assert grid_option("antithetic = true,false", BASE).values == (True, False)
    assert grid_option("max_steps=none,10", BASE).values == (None, 10)
    parameter = grid_option("noise_std=1e-3,2e-3", BASE)
    spec = parse_space(space(parameters={parameter.name: parameter.to_dict()}), BASE)
    assert spec.parameters == (parameter,)


# --------------------------------------------------------------------------- what is refused

ERRORS = [
    # (mapping, field, words of the message)
    ([1, 2], "space", "must be a mapping"),
    (space(budgte=3), "budgte", "did you mean 'budget'"),
    (space(method="gird"), "method", "did you mean 'grid'"),
    (space(parameters=None), "parameters", "at least one option"),
    (space(parameters={}), "parameters", "at least one option"),
    (space(parameters={"nosie_std": {"values": [1]}}), "parameters.nosie_std", "'noise_std'"),
    (space(parameters={"es.noise_std": {"values": [1]}}), "parameters.es.noise_std", "unknown"),
    (space(parameters={"method": {"values": ["es"]}}), "parameters.method", "cannot be swept"),
    (space(parameters={"run_name": {"values": ["a"]}}), "parameters.run_name", "cannot be swept"),
    (space(parameters={"output_dir": {"values": ["a"]}}), "parameters.output_dir", "own output"),
    (space(parameters={"eval_file": {"values": ["a"]}}), "parameters.eval_file", "cannot be"),
    (space(parameters={"seed": [1, 2]}), "parameters.seed", "must be a mapping"),
    (space(parameters={"seed": {"min": 1}}), "parameters.seed.min", "not a parameter key"),
    (
        space(parameters={"seed": {"values": [1], "low": 0}}),
        "parameters.seed",
        "values and a range",
    ),
    (space(parameters={"seed": {"values": []}}), "parameters.seed.values", "non-empty list"),
    (space(parameters={"seed": {"values": 3}}), "parameters.seed.values", "non-empty list"),
    (
        space(parameters={"noise_std": {"values": [0.001, 0]}}),
        "parameters.noise_std.values[1]",
        "must be > 0, got 0",
    ),
    (
        space(parameters={"fitness_shaping": {"values": ["zscore", "rank"]}}),
        "parameters.fitness_shaping.values[1]",
        "must be one of",
    ),
    (space(parameters={"seed": {"values": [1, "1"]}}), "parameters.seed.values", "1 twice"),
    (
        space(parameters={"fitness_shaping": {"low": 0, "high": 1}}),
        "parameters.fitness_shaping",
        "text, which has no range",
    ),
    (
        space(parameters={"antithetic": {"low": 0, "high": 1}}),
        "parameters.antithetic",
        "true or false, which has no range",
    ),
    (space(parameters={"seed": {"low": 1}}), "parameters.seed.high", "is required"),
    (space(parameters={"seed": {"low": 3, "high": 3}}), "parameters.seed.low", "< high (3)"),
    (
        space(method="random", budget=2, parameters={"noise_std": {"low": 0, "high": 1}}),
        "parameters.noise_std.low",
        "must be > 0",
    ),
    (
        space(method="random", budget=2, parameters={"lora_rank": {"low": 1, "high": 300}}),
        "parameters.lora_rank.high",
        "must be <= 256",
    ),
    (
        space(parameters={"population_size": {"low": 2.5, "high": 8}}),
        "parameters.population_size.low",
        "must be an integer",
    ),
    (
        space(
            method="random",
            budget=2,
            parameters={"learning_rate": {"low": 0, "high": 1e-3, "log": True}},
        ),
        "parameters.learning_rate.low",
        "log true",
    ),
    (
        space(method="random", budget=2, parameters={"noise_std": {"low": 1, "high": 2, "log": 3}}),
        "parameters.noise_std.log",
        "true or false",
    ),
    (
        space(parameters={"max_steps": {"low": "none", "high": 10}}),
        "parameters.max_steps.low",
        "must be a number",
    ),
    (
        space(parameters={"noise_std": {"low": 0.001, "high": 0.002}}),
        "parameters.noise_std",
        "a grid needs values",
    ),
    (space(parameters={"seed": {"low": 1, "high": 5, "log": True}}), "parameters.seed.log", "grid"),
    (space(parameters={"seed": {"low": 0, "high": 5000}}), "parameters.seed", "more than the 1000"),
    (
        space(
            parameters={"seed": {"low": 0, "high": 999}, "antithetic": {"values": [True, False]}}
        ),
        "budget",
        "(this one has 2000)",
    ),
    (space(budget=3), "budget", "<= the grid's 2 points, got 3"),
    (space(budget=0), "budget", "budget must be >= 1"),
    (space(method="random"), "budget", "required with method random"),
    (space(method="tpe", budget=5000), "budget", "must be <= 1000"),
    (space(method="random", budget=True), "budget", "must be an integer"),
    (space(parallel=0), "parallel", "parallel must be >= 1"),
    (space(seed=-1), "seed", "seed must be >= 0"),
    (space(objective=None), "objective", "objective must be"),
    (
        space(objective={"metric": "time/step", "goal": "min"}),
        "objective.goal",
        "not a key of objective",
    ),
    (space(objective={"mode": "min"}), "objective.metric", "must be a metric key"),
    (space(objective="eval/reward/maen"), "objective.metric", "did you mean 'eval/reward/mean'"),
    (space(objective="loss"), "objective.metric", "docs/metrics.md"),
    (space(objective="time/step:lowest"), "objective.mode", "must be one of max, min"),
    (
        space(objective={"metric": "time/step", "summary": "mean"}),
        "objective.summary",
        "must be one of last, best",
    ),
    (space(early_stopping="median"), "early_stopping", "with a rule"),
    (space(early_stopping={"metric": "time/step"}), "early_stopping", "with a rule"),
    (space(early_stopping={"rule": "hyperband"}), "early_stopping.rule", "median, halving"),
    (space(early_stopping={"rule": "median", "eta": 2}), "early_stopping.eta", "halving"),
    (space(early_stopping={"rule": "halving", "eta": 1}), "early_stopping.eta", "must be >= 2"),
    (space(early_stopping={"rule": "median", "min_step": 0}), "early_stopping.min_step", ">= 1"),
    (space(early_stopping={"rule": "median", "min_runs": 0}), "early_stopping.min_runs", ">= 1"),
    (
        space(early_stopping={"rule": "median", "metric": "train/reward/avg"}),
        "early_stopping.metric",
        "not a metric key",
    ),
    (space(early_stopping={"rule": "median", "patience": 3}), "early_stopping.patience", "key"),
]


@pytest.mark.parametrize(("mapping", "field", "words"), ERRORS)
def test_every_problem_names_its_field(mapping, field, words):
    error = refused(mapping)
    assert error.field == field
    assert field in str(error)
    assert words in str(error)


def test_a_grid_point_that_breaks_a_rule_is_named_by_its_values():
    error = refused(
        space(
            parameters={
                "antithetic": {"values": [True]},
                "population_size": {"values": [8, 9]},
            }
        )
    )
    assert error.field == "parameters.population_size"
    assert str(error).startswith("parameters.population_size: the run at")
    assert "antithetic=True, population_size=9" in str(error)
    assert "es.population_size must be even" in str(error)


def test_an_option_the_base_method_never_reads_is_refused():
    error = refused(space(parameters={"top_k_rewards": {"values": [2]}}))
    assert error.field == "parameters.top_k_rewards"
    assert "only applies to method 'lbes'" in str(error)


def test_random_checks_the_bounds_of_its_ranges_against_the_base():
    lora = BASE.with_overrides(["perturbation=lora"])
    mapping = space(method="tpe", budget=4, parameters={"lora_rank": {"low": 1, "high": 64}})
    assert parse_space(mapping, lora).parameters[0].high == 64
    error = refused(mapping)  # the base perturbs full rank: a rank is never read
    assert error.field == "parameters.lora_rank"
    assert "lora_rank=1" in str(error) and "only applies to perturbation 'lora'" in str(error)


def test_a_problem_of_no_swept_option_names_the_parameters():
    error = refused(space(parameters={"eval_strategy": {"values": ["steps"]}}))
    assert error.field == "parameters" and str(error).startswith("parameters: the run at")
    assert "eval_strategy='steps'" in str(error) and "data.eval_file is required" in str(error)


def test_an_eval_objective_needs_runs_that_evaluate():
    error = refused(space(objective="eval/reward/mean"))
    assert error.field == "objective.metric"
    assert "eval_strategy is 'no' in the base configuration" in str(error)
    swept = space(
        objective="eval/reward/mean", parameters={"eval_strategy": {"values": ["steps", "no"]}}
    )
    error = refused(swept, EVALUATING)
    assert error.field == "objective.metric" and "the run at eval_strategy='no'" in str(error)
    assert "leave 'no' out of parameters.eval_strategy" in str(error)
    stopping = space(early_stopping={"rule": "median", "metric": "eval/reward/mean"})
    assert refused(stopping).field == "early_stopping.metric"
    assert parse_space(space(objective="eval/reward/mean"), EVALUATING).budget == 2


GRID_OPTION_ERRORS = [
    ("noise_std", "grid", "must look like option=a,b,c"),
    ("=1,2", "grid", "must look like option=a,b,c"),
    ("noise_std=", "grid", "must look like option=a,b,c"),
    ("nosie_std=1", "parameters.nosie_std", "did you mean 'noise_std'"),
    ("run_name=a,b", "parameters.run_name", "cannot be swept"),
    ("noise_std=0.001,0", "parameters.noise_std.values[1]", "must be > 0"),
    ("seed=1,,2", "parameters.seed.values[1]", "must be an integer"),
    ("lora_rank=1,2", "parameters.lora_rank", "only applies to perturbation 'lora'"),
]


@pytest.mark.parametrize(("text", "field", "words"), GRID_OPTION_ERRORS)
def test_grid_option_errors_name_the_field(text, field, words):
    with pytest.raises(SweepSpecError) as info:
        grid_option(text, BASE)
    assert info.value.field == field and words in str(info.value)
    assert field in str(info.value)
