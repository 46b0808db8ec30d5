"""The samplers: grid in its fixed order, random reproducible from (seed, trial number), tpe
through Optuna rebuilt from the trials; the budget and the grid's end respected."""

from __future__ import annotations

import itertools
import logging
import math
import warnings

import optuna
import pytest

from jobs.sweeps import Trial, next_number, suggest
from jobs.sweeps.parsing import parse

OBJECTIVE = {"metric": "train/reward/mean"}
RANGES = {
    "noise_std": {"low": 1e-4, "high": 1e-1, "log": True},
    "learning_rate": {"low": 0.0, "high": 1e-3},
    "population_size": {"low": 2, "high": 64, "log": True},
    "seed": {"low": 0, "high": 3},
    "fitness_shaping": {"values": ["zscore", "centered_rank"]},
}


def sweep(method: str = "random", budget: int = 100, parameters=None, **keys):
    return parse(
        {
            "method": method,
            "budget": budget,
            "objective": OBJECTIVE,
            "parameters": parameters or RANGES,
            **keys,
        }
    )


def ran(spec, count: int, value=lambda i, params: float(i)) -> list[Trial]:
    """`count` trials as suggest makes them, each complete with `value`."""
    trials: list[Trial] = []
    for i in range(count):
        params = suggest(spec, trials)
        trials.append(Trial(next_number(trials), params, value(i, params), "complete"))
    return trials


def nth(spec, number: int) -> dict:
    """Random's draw for trial `number`, whatever came before."""
    before = [Trial(number - 1, {}, None, "failed")] if number else []
    return suggest(spec, before)


# --------------------------------------------------------------------------- grid


def test_grid_goes_through_the_points_in_product_order_then_stops():
    spec = sweep(
        "grid",
        budget=None,
        parameters={"seed": {"values": [1, 2, 3]}, "antithetic": {"values": [False, True]}},
    )
    trials = ran(spec, 6)
    assert [t.params for t in trials] == [
        {"seed": s, "antithetic": a} for s, a in itertools.product([1, 2, 3], [False, True])
    ]
    assert suggest(spec, trials) is None


def test_grid_with_a_smaller_budget_runs_its_first_points():
    spec = sweep("grid", budget=2, parameters={"seed": {"low": 0, "high": 9}})
    trials = ran(spec, 2)
    assert [t.params["seed"] for t in trials] == [0, 1]
    assert suggest(spec, trials) is None


def test_grid_gives_a_deleted_runs_point_again_and_never_a_taken_one():
    spec = sweep("grid", budget=None, parameters={"seed": {"values": [5, 6, 7]}})
    trials = [Trial(0, {"seed": 5}, 1.0, "complete"), Trial(2, {"seed": 7}, None, "failed")]
    assert suggest(spec, trials) == {"seed": 6}
    assert next_number(trials) == 3


# --------------------------------------------------------------------------- random


def test_random_depends_on_the_seed_and_the_trial_number_only():
    spec = sweep()
    first = suggest(spec, [])
    assert suggest(spec, []) == first
    assert suggest(sweep(seed=1), []) != first
    # trial 1's draw: whatever trial 0 was, did or is
    done = [Trial(0, first, 3.0, "complete")]
    other = [Trial(0, {"seed": 2}, None, "running")]
    assert suggest(spec, done) == suggest(spec, other) == nth(spec, 1) != first


def test_random_draws_within_the_ranges_with_the_options_types():
    spec = sweep()
    draws = [nth(spec, n) for n in range(400)]
    for draw in draws:
        assert 1e-4 <= draw["noise_std"] <= 1e-1 and 0.0 <= draw["learning_rate"] <= 1e-3
        assert type(draw["population_size"]) is int and 2 <= draw["population_size"] <= 64
        assert type(draw["noise_std"]) is float
    assert {d["seed"] for d in draws} == {0, 1, 2, 3}  # both ends of an integer range
    assert {d["fitness_shaping"] for d in draws} == {"zscore", "centered_rank"}
    # log: each decade of noise_std about equally often (uniform would put 90% in the last)
    decades = [math.floor(math.log10(d["noise_std"])) for d in draws]
    assert all(80 <= decades.count(k) <= 190 for k in (-4, -3, -2))
    # log integers: as many draws in 2..8 as in 16..64, not 4 times fewer
    small = sum(d["population_size"] <= 8 for d in draws)
    large = sum(d["population_size"] >= 16 for d in draws)
    assert 0.6 < small / large < 1.6
    # not log: uniform
    assert 120 <= sum(d["learning_rate"] < 5e-4 for d in draws) <= 280


@pytest.mark.parametrize("method", ["grid", "random", "tpe"])
def test_the_budget_counts_every_trial_whatever_its_state(method):
    spec = sweep(method, budget=3, parameters={"seed": {"values": [1, 2, 3, 4]}})
    states = ["complete", "failed", "running"]
    trials = []
    for state in states:
        params = suggest(spec, trials)
        assert params is not None
        trials.append(Trial(next_number(trials), params, None, state))
    assert suggest(spec, trials) is None


# --------------------------------------------------------------------------- tpe


def objective(i: int, params: dict) -> float:
    return -((math.log10(params["noise_std"]) + 2.5) ** 2) - (params["seed"] == 2)


def test_tpe_gives_the_same_suggestion_for_the_same_history():
    spec = sweep("tpe", budget=40)
    trials = ran(spec, 25, objective)  # past the random start (10 trials)
    trials[-1] = Trial(trials[-1].number, trials[-1].params, None, "running")
    trials[-2] = Trial(trials[-2].number, trials[-2].params, -9.0, "pruned")
    trials[-3] = Trial(trials[-3].number, trials[-3].params, None, "failed")
    shuffled = trials[1::2] + trials[::2]
    assert suggest(spec, trials) == suggest(spec, shuffled) == suggest(spec, list(trials))
    assert suggest(sweep("tpe", budget=40, seed=7), trials) != suggest(spec, trials)


def test_tpe_suggests_within_the_space_and_learns_from_the_values():
    spec = sweep("tpe", budget=60)
    trials = ran(spec, 50, objective)
    for t in trials:
        assert 1e-4 <= t.params["noise_std"] <= 1e-1 and type(t.params["population_size"]) is int
        assert t.params["fitness_shaping"] in ("zscore", "centered_rank")
    start, end = trials[:10], trials[-15:]
    mean = lambda ts: sum(t.value for t in ts) / len(ts)  # noqa: E731
    assert mean(end) > mean(start)


def test_tpe_steers_away_from_running_trials():
    # a running trial is a constant liar (the worst value): put one at the very point tpe
    # would suggest, and the suggestion moves; a failed trial there is ignored
    spec = sweep("tpe", budget=40)
    trials = ran(spec, 20, objective)
    number = next_number(trials) + 1  # the same number asked in both histories
    ignored = Trial(number - 1, trials[0].params, None, "failed")
    point = suggest(spec, [*trials, ignored])
    failed = Trial(number - 1, point, None, "failed")
    running = Trial(number - 1, point, None, "running")
    assert suggest(spec, [*trials, failed]) == point
    assert suggest(spec, [*trials, running]) != point


def test_tpe_minimizes_when_the_objective_says_min():
    def loss(i, params):
        return (math.log10(params["noise_std"]) + 2.5) ** 2

    spec = sweep("tpe", budget=60, objective="train/reward/mean:min")
    trials = ran(spec, 50, loss)
    assert sum(t.value for t in trials[-15:]) < sum(t.value for t in trials[:15])


def test_tpe_is_quiet_and_leaves_optunas_logging_as_it_was(capsys):
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ran(sweep("tpe", budget=15), 12, objective)
        assert optuna.logging.get_verbosity() == logging.INFO
    finally:
        optuna.logging.set_verbosity(before)
    assert caught == [] and capsys.readouterr().err == ""
