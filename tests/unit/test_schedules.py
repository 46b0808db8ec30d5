"""Schedules against values computed by hand from the lbes formulas."""

import math

import pytest

from engine.schedules import SCHEDULES, planned_schedule, schedule_value


def test_registry_names():
    assert set(SCHEDULES) == {"constant", "linear", "cosine", "exponential", "polynomial"}


@pytest.mark.parametrize("step", [0, 3, 4, 100])
def test_constant_ignores_step_and_final(step):
    assert schedule_value("constant", 2.0, 0.5, step, 4) == 2.0


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1.0),
        (1, 0.75),
        (2, 0.5),
        (3, 0.25),
        (4, 0.0),  # at total_steps: held at final
        (9, 0.0),  # past the end
    ],
)
def test_linear(step, expected):
    assert schedule_value("linear", 1.0, 0.0, step, 4) == pytest.approx(expected)


def test_linear_towards_a_nonzero_final():
    # 1 + (0.2 - 1) * 1/4 = 0.8
    assert schedule_value("linear", 1.0, 0.2, 1, 4) == pytest.approx(0.8)
    assert schedule_value("linear", 1.0, 0.2, 5, 4) == 0.2


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1.0),
        (1, 0.5 * (1 + math.cos(math.pi / 4))),  # 0.853553...
        (2, 0.5),
        (3, 0.5 * (1 + math.cos(3 * math.pi / 4))),  # 0.146446...
        (4, 0.0),
        (7, 0.0),
    ],
)
def test_cosine(step, expected):
    assert schedule_value("cosine", 1.0, 0.0, step, 4) == pytest.approx(expected)


def test_cosine_with_final():
    # halfway: 0.1 + (1 - 0.1) * 0.5 = 0.55
    assert schedule_value("cosine", 1.0, 0.1, 2, 4) == pytest.approx(0.55)


@pytest.mark.parametrize(("step", "expected"), [(0, 2.0), (1, 1.0), (3, 0.25), (5, 0.0625)])
def test_exponential_ignores_final_and_total(step, expected):
    # 2 * 0.5**step; total_steps 2 and final 1.0 change nothing, as in the reference.
    assert schedule_value("exponential", 2.0, 1.0, step, 2, rate=0.5) == pytest.approx(expected)


def test_exponential_default_rate_is_the_reference_095():
    assert schedule_value("exponential", 2.0, 0.0, 2, 10) == pytest.approx(2.0 * 0.9025)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1.0),
        (1, 0.5625),
        (2, 0.25),
        (3, 0.0625),
        (4, 0.0),
        (6, 0.0),
    ],
)
def test_polynomial_power_two(step, expected):
    # (1 - step/4)**2
    assert schedule_value("polynomial", 1.0, 0.0, step, 4, power=2.0) == pytest.approx(expected)


def test_polynomial_power_one_is_linear():
    for step in range(6):
        assert schedule_value("polynomial", 3.0, 1.0, step, 4) == pytest.approx(
            schedule_value("linear", 3.0, 1.0, step, 4)
        )


def test_zero_total_steps_holds_final():
    assert schedule_value("linear", 1.0, 0.3, 0, 0) == 0.3


def test_planned_schedule_lists_every_step():
    assert planned_schedule("linear", 1.0, 0.0, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert planned_schedule("exponential", 1.0, 0.0, 3, rate=0.5) == pytest.approx([1.0, 0.5, 0.25])
    assert planned_schedule("cosine", 1.0, 0.0, 0) == []


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_every_schedule_starts_at_initial(kind):
    assert schedule_value(kind, 0.7, 0.1, 0, 10) == pytest.approx(0.7)


def test_unknown_kind_and_negative_step_are_refused():
    with pytest.raises(ValueError, match=r"unknown schedule 'step'.*constant"):
        schedule_value("step", 1.0, 0.0, 0, 4)
    with pytest.raises(ValueError, match=r">= 0"):
        schedule_value("linear", 1.0, 0.0, -1, 4)
