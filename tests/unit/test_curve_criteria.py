"""The criteria a preset's eval curve is held to (bench/curve_criteria.py): at least 40% of the
way from the untrained model to the optimum, and the last eval within 15% of the best."""

import pytest

from bench.curve_criteria import judge

# es-conciseness before its tuning, seed 42: learned, then collapsed
LEARNED_THEN_COLLAPSED = {0: -212.1, 5: -70.2, 10: -56.4, 15: -116.6, 20: -127.9}


def test_a_run_that_learned_then_collapsed_fails_both():
    v = judge(LEARNED_THEN_COLLAPSED, optimum=0.0)
    assert (v.before, v.best, v.best_step, v.after) == (-212.1, -56.4, 10, -127.9)
    assert v.closer_by == pytest.approx((212.1 - 127.9) / 212.1)  # 39.7%
    assert v.drop == pytest.approx((127.9 - 56.4) / 56.4)
    assert not v.learned and not v.kept and not v.passed


def test_a_run_that_kept_what_it_learned_passes():
    v = judge({0: -200.0, 10: -60.0, 20: -65.0}, optimum=0.0)
    assert v.closer_by == pytest.approx(0.675) and v.drop == pytest.approx(5 / 60)
    assert v.learned and v.kept and v.passed


def test_the_thresholds_are_inclusive():
    assert judge({0: -100.0, 10: -60.0}, optimum=0.0).learned  # exactly 40% closer
    assert not judge({0: -100.0, 10: -60.5}, optimum=0.0).learned
    assert judge({0: -200.0, 5: -100.0, 10: -115.0}, optimum=0.0).kept  # exactly 15% below
    assert not judge({0: -200.0, 5: -100.0, 10: -115.5}, optimum=0.0).kept


def test_the_optimum_need_not_be_zero():
    v = judge({0: 0.2, 5: 0.9, 10: 0.8}, optimum=1.0)
    assert v.closer_by == pytest.approx(0.75) and v.drop == pytest.approx(0.1 / 0.9)
    assert v.passed


def test_edge_cases_at_the_optimum():
    already = judge({0: 0.0, 10: 0.0}, optimum=0.0)
    assert already.closer_by is None and not already.learned  # nothing left to learn
    reached = judge({0: -10.0, 5: 0.0, 10: -1.0}, optimum=0.0)
    assert reached.drop is None and not reached.kept  # a best of 0 allows no drop
    held = judge({0: -10.0, 5: 0.0, 10: 0.0}, optimum=0.0)
    assert held.drop == 0.0 and held.passed


def test_the_first_of_equal_bests_is_the_best_step():
    assert judge({0: -50.0, 5: -20.0, 10: -20.0}, optimum=0.0).best_step == 5


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ({5: -10.0, 10: -5.0}, "step 0"),
        ({0: -10.0}, "a later eval"),
        ({0: -10.0, 5: 3.0}, "beyond the optimum"),
    ],
)
def test_a_curve_that_cannot_be_judged_is_refused(curve, message):
    with pytest.raises(ValueError, match=message):
        judge(curve, optimum=0.0)
