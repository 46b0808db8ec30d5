"""Early stopping (median rule, asynchronous successive halving) and the objective, on curves
made by hand: {step: value}."""

from __future__ import annotations

import pytest

from jobs.sweeps import EarlyStopping, Objective, Trial, objective_value, rank, should_stop

METRIC = "eval/reward/mean"


def median(min_step: int = 1, min_runs: int = 3) -> EarlyStopping:
    return EarlyStopping("median", METRIC, min_step=min_step, min_runs=min_runs)


def halving(min_step: int = 1, min_runs: int = 3, eta: int = 3) -> EarlyStopping:
    return EarlyStopping("halving", METRIC, min_step=min_step, min_runs=min_runs, eta=eta)


def flat(value: float, steps: int = 10) -> dict[int, float]:
    return dict.fromkeys(range(1, steps + 1), value)


# --------------------------------------------------------------------------- median rule


def test_median_stops_a_run_whose_best_is_below_the_median_of_running_averages():
    others = [flat(1.0), flat(2.0), flat(3.0)]
    reason = should_stop(median(), "max", {1: 0.5, 2: 1.5, 3: 1.0}, others)
    assert reason == (
        "eval/reward/mean: the best 1.5 by step 3 is below the median 2 of 3 other runs' "
        "running averages at that step"
    )
    assert should_stop(median(), "max", {1: 0.5, 2: 2.5}, others) is None


def test_median_compares_with_running_averages_not_latest_values():
    # the others end high but averaged 1.0 up to step 3: a best of 1.5 goes on
    rising = {1: 0.0, 2: 1.0, 3: 2.0, 4: 9.0}
    assert should_stop(median(), "max", {3: 1.5}, [rising] * 3) is None
    assert should_stop(median(), "max", {3: 0.5}, [rising] * 3) is not None


def test_median_in_min_mode_stops_runs_above_it():
    others = [flat(1.0), flat(2.0), flat(3.0)]
    reason = should_stop(median(), "min", {1: 2.5, 2: 4.0}, others)
    assert reason is not None and "2.5 by step 2 is above the median 2" in reason
    assert should_stop(median(), "min", {1: 1.5}, others) is None


def test_median_keeps_a_run_tied_with_the_median():
    assert should_stop(median(), "max", {5: 2.0}, [flat(1.0), flat(2.0), flat(3.0)]) is None
    assert should_stop(median(), "min", {5: 2.0}, [flat(1.0), flat(2.0), flat(3.0)]) is None


def test_median_waits_for_min_step_and_min_runs():
    others = [flat(1.0), flat(2.0), flat(3.0)]
    assert should_stop(median(min_step=4), "max", {1: 0.0, 3: 0.0}, others) is None
    assert should_stop(median(min_step=4), "max", {1: 0.0, 4: 0.0}, others) is not None
    assert should_stop(median(min_runs=4), "max", {1: 0.0}, others) is None
    assert should_stop(median(), "max", {}, others) is None
    assert should_stop(median(), "max", {1: 0.0}, []) is None


def test_median_leaves_out_runs_that_have_not_reached_the_step():
    # two others got past step 6, one stopped at step 4 (or runs behind): 2 < min_runs
    behind = {1: 9.0, 2: 9.0, 3: 9.0, 4: 9.0}
    others = [flat(5.0), flat(5.0), behind]
    assert should_stop(median(), "max", {6: 0.0}, others) is None
    assert should_stop(median(), "max", {4: 0.0}, others) is not None
    # reported at steps 2, 4, 6: at step 5 a run counts with its steps 2 and 4
    sparse = {2: 1.0, 4: 3.0, 6: 100.0}
    reason = should_stop(median(), "max", {5: 1.5}, [sparse] * 3)
    assert reason is not None and "median 2 " in reason


# --------------------------------------------------------------------------- halving


def test_halving_keeps_the_best_third_at_a_rung():
    # rungs 1, 3, 9: a run at step 5 is judged at rung 1 (step 3) with its value there
    others = [{3: 4.0, 5: 0.0}, {3: 3.0}, {2: 2.0, 4: 0.0}, {3: 1.0}, {1: 0.0, 3: 0.0}]
    # 6 runs at step 3 -> the best 2 go on (the others are 4, 3, 2, 1, 0 there)
    assert should_stop(halving(), "max", {1: 9.0, 3: 3.5, 5: -1.0}, others) is None
    reason = should_stop(halving(), "max", {1: 9.0, 3: 2.5, 5: 9.0}, others)
    assert reason == (
        "eval/reward/mean: 2.5 at step 3 (rung 1) is below 3, the cutoff of the best 1/3 of "
        "6 runs at that step"
    )


def test_halving_keeps_a_value_tied_with_the_cutoff():
    others = [{3: 4.0}, {3: 3.0}, {3: 2.0}, {3: 1.0}, {3: 0.0}]
    assert should_stop(halving(), "max", {3: 3.0}, others) is None
    assert should_stop(halving(), "min", {3: 1.0}, others) is None
    assert should_stop(halving(), "min", {3: 1.5}, others) is not None


def test_halving_with_few_runs_keeps_only_the_best():
    others = [{1: 1.0}, {1: 2.0}, {1: 3.0}]  # 4 runs // eta 3 = 1
    assert should_stop(halving(), "max", {1: 2.5}, others) is not None
    assert should_stop(halving(), "max", {1: 3.5}, others) is None
    assert should_stop(halving(), "min", {1: 0.5}, others) is None


def test_halving_judges_at_the_highest_rung_reached_with_runs_that_reached_it():
    # at step 9 (rung 2) only two others got there: too few, whatever rung 1 said
    others = [{3: 5.0, 9: 5.0}, {3: 5.0, 9: 5.0}, {3: 5.0}, {3: 5.0}]
    assert should_stop(halving(), "max", {3: 0.0, 9: 0.0}, others) is None
    assert should_stop(halving(), "max", {3: 0.0, 8: 0.0}, others) is not None
    assert should_stop(halving(min_runs=2), "max", {3: 0.0, 9: 0.0}, others) is not None


def test_halving_rungs_start_at_min_step_and_grow_by_eta():
    others = [{4: 1.0, 8: 1.0, 16: 1.0}] * 3
    rule = halving(min_step=4, eta=2)
    assert should_stop(rule, "max", {3: 0.0}, others) is None  # before min_step
    assert "(rung 0)" in should_stop(rule, "max", {4: 0.0, 7: 5.0}, others)
    assert "at step 8 (rung 1)" in should_stop(rule, "max", {8: 0.0, 15: 5.0}, others)
    assert "at step 16 (rung 2)" in should_stop(rule, "max", {16: 0.0}, others)


def test_halving_needs_a_value_at_or_before_the_rung():
    others = [{1: 1.0, 3: 1.0}] * 3
    assert should_stop(halving(), "max", {4: 0.0}, others) is None  # nothing by step 3


# --------------------------------------------------------------------------- objective


@pytest.mark.parametrize(
    ("mode", "summary", "expected"),
    [("max", "last", 2.0), ("min", "last", 2.0), ("max", "best", 5.0), ("min", "best", 1.0)],
)
def test_objective_value_is_the_last_or_the_best_by_mode(mode, summary, expected):
    curve = {3: 5.0, 1: 1.0, 10: 2.0}  # steps in any order
    assert objective_value(Objective(METRIC, mode, summary), curve) == expected


def test_objective_value_of_a_run_that_reported_nothing_is_none():
    assert objective_value(Objective(METRIC, "max", "best"), {}) is None


def test_rank_puts_the_best_first_and_runs_without_a_value_last():
    trials = [
        Trial(0, {}, None, "failed"),
        Trial(1, {}, 2.0, "complete"),
        Trial(2, {}, 3.0, "pruned"),
        Trial(3, {}, 2.0, "complete"),
        Trial(4, {}, None, "running"),
    ]
    assert [t.number for t in rank(trials, "max")] == [2, 1, 3, 0, 4]
    assert [t.number for t in rank(trials, "min")] == [1, 3, 2, 0, 4]
