"""LBES filters and correlation against hand-computed expectations."""

import math

import numpy as np
import pytest

from engine.config import LbesConfig
from engine.fitness import zscore
from engine.lbes import (
    FilterResult,
    TieBreak,
    correlation,
    filter_rewards,
    member_correlations,
    reference_tiebreak,
)
from engine.noise import derive_seed


class FixedDraws:
    """Stands in for a Generator: returns chosen tie-break draws, checking their count."""

    def __init__(self, draws=None):
        self.draws = draws

    def random(self, size):
        assert self.draws is not None, "this filter should not have drawn"
        assert size == len(self.draws)
        return np.array(self.draws)


def tb(prompt_var=None, flat=None) -> TieBreak:
    return TieBreak(prompt_var=FixedDraws(prompt_var), flat=FixedDraws(flat))


def run(rewards, **options) -> FilterResult:
    """Filters that draw no random numbers (per-prompt k, same rewards, none)."""
    return filter_rewards(np.array(rewards, dtype=float), LbesConfig(**options), tb())


def kept(result: FilterResult) -> list[list[int]]:
    return result.kept.astype(int).tolist()


# --------------------------------------------------------------------------- no filter


def test_no_filter_keeps_everything():
    result = run([[1, 0], [2, 2]])
    assert result.kept.all()
    assert all(name is None for name in result.dropped_by.ravel())
    assert result.retained_prompt_ratio == 1.0
    assert result.retained_reward_ratio == 1.0
    assert not result.is_empty


# --------------------------------------------------------------------------- 1. prompt variance

# variances (ddof 0): 0.25, 0, 0.171875, 0.75
VAR_REWARDS = [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0.5, 1, 0], [2, 0, 0, 0]]


def test_top_k_prompt_reward_var_keeps_the_most_varied_prompts():
    result = filter_rewards(
        np.array(VAR_REWARDS),
        LbesConfig(top_k_prompt_reward_var=2),
        tb(prompt_var=[0.5, 0.5, 0.5, 0.5]),
    )
    assert kept(result) == [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert set(result.dropped_by[1]) == set(result.dropped_by[2]) == {"top_k_prompt_reward_var"}
    assert result.retained_prompt_ratio == 0.5
    assert result.retained_reward_ratio == 0.5


@pytest.mark.parametrize(("draws", "winner"), [([0.9, 0.1, 0.5], 0), ([0.1, 0.9, 0.5], 1)])
def test_top_k_prompt_reward_var_tie_goes_to_the_larger_draw(draws, winner):
    # prompts 0 and 1 tie at variance 0.25; prompt 2 has variance 0
    result = filter_rewards(
        np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
        LbesConfig(top_k_prompt_reward_var=1),
        tb(prompt_var=draws),
    )
    assert result.kept_prompts.tolist() == [i == winner for i in range(3)]


def test_top_k_prompt_reward_var_larger_than_batch_keeps_all():
    result = filter_rewards(
        np.array([[0.0, 1.0]]), LbesConfig(top_k_prompt_reward_var=5), tb(prompt_var=[0.3])
    )
    assert result.kept.all()


# --------------------------------------------------------------------------- 2. per-prompt k


def test_top_k_rewards_ties_keep_the_later_sample():
    # stable ascending order of [1, 3, 3, 2]: 0, 3, 1, 2 -> top-1 is index 2
    result = run([[1, 3, 3, 2]], top_k_rewards=1)
    assert kept(result) == [[0, 0, 1, 0]]
    assert result.dropped_by[0].tolist() == [
        "top_k_rewards",
        "top_k_rewards",
        None,
        "top_k_rewards",
    ]
    assert kept(run([[1, 3, 3, 2]], top_k_rewards=2)) == [[0, 1, 1, 0]]


def test_bottom_k_rewards_ties_keep_the_earlier_sample():
    # stable ascending order of [2, 1, 1, 5]: 1, 2, 0, 3 -> bottom-1 is index 1
    result = run([[2, 1, 1, 5]], bottom_k_rewards=1)
    assert kept(result) == [[0, 1, 0, 0]]
    assert result.dropped_by[0, 0] == "bottom_k_rewards"


def test_ties_in_a_row_of_eight_follow_the_stable_order():
    # numpy's default argsort on AVX-512 CPUs orders the two zeros as 5, 4 here; the stable
    # order (4, 5) is what this implementation promises.
    row = [[1.1, 0.1, 0.1, 1.1, 0.0, 0.0, 0.1, 1.1]]
    assert kept(run(row, bottom_k_rewards=1)) == [[0, 0, 0, 0, 1, 0, 0, 0]]
    assert kept(run(row, top_k_rewards=2)) == [[0, 0, 0, 1, 0, 0, 0, 1]]


def test_all_equal_rewards_top_and_bottom_pick_last_and_first():
    assert kept(run([[5, 5, 5]], top_k_rewards=1)) == [[0, 0, 1]]
    assert kept(run([[5, 5, 5]], bottom_k_rewards=1)) == [[1, 0, 0]]


def test_top_and_bottom_keep_their_union():
    result = run([[1, 3, 3, 2], [4, 0, 9, 9]], top_k_rewards=1, bottom_k_rewards=1)
    assert kept(result) == [[1, 0, 1, 0], [0, 1, 0, 1]]
    assert result.dropped_by[0, 1] == "top_k_rewards+bottom_k_rewards"
    assert result.retained_reward_ratio == 0.5
    assert result.retained_prompt_ratio == 1.0


def test_k_larger_than_n_keeps_all_samples():
    assert run([[1, 2]], top_k_rewards=5).kept.all()


# --------------------------------------------------------------------------- 3. same rewards


def test_exclude_same_rewards_drops_flat_prompts():
    result = run([[1, 1, 1], [1, 0, 1], [2, 2 + 1e-9, 2]], exclude_same_rewards_samples=True)
    assert result.kept_prompts.tolist() == [False, True, False]
    assert set(result.dropped_by[2]) == {"exclude_same_rewards_samples"}
    assert result.retained_prompt_ratio == pytest.approx(1 / 3)


def test_exclude_same_rewards_keeps_a_prompt_with_one_sample_left():
    # top-1 leaves a single sample: the reference only compares when more than one is kept
    result = run([[1, 1, 1]], top_k_rewards=1, exclude_same_rewards_samples=True)
    assert kept(result) == [[0, 0, 1]]


def test_exclude_same_rewards_looks_at_kept_samples_only():
    # [3, 9, 3]: stable order 0, 2, 1 -> top-1 is 1, bottom-1 is 0: rewards 9 and 3 differ.
    # [3, 3, 3]: top-1 is 2, bottom-1 is 0: both 3, so the prompt is dropped.
    result = run(
        [[3, 9, 3], [3, 3, 3]],
        top_k_rewards=1,
        bottom_k_rewards=1,
        exclude_same_rewards_samples=True,
    )
    assert kept(result) == [[1, 1, 0], [0, 0, 0]]
    assert result.dropped_by[1].tolist() == [
        "exclude_same_rewards_samples",
        "top_k_rewards+bottom_k_rewards",
        "exclude_same_rewards_samples",
    ]


# --------------------------------------------------------------------------- 4. flat k


def test_flat_top_k_and_bottom_k():
    rewards = np.array([[0.0, 3.0], [1.0, 2.0], [5.0, 4.0]])
    result = filter_rewards(rewards, LbesConfig(flat_top_k_rewards=2), tb(flat=[0.5] * 6))
    assert kept(result) == [[0, 0], [0, 0], [1, 1]]
    assert result.dropped_by[0, 1] == "flat_top_k_rewards"
    assert result.retained_prompt_ratio == pytest.approx(1 / 3)
    assert result.retained_reward_ratio == pytest.approx(2 / 6)

    both = filter_rewards(
        rewards, LbesConfig(flat_top_k_rewards=1, flat_bottom_k_rewards=1), tb(flat=[0.5] * 6)
    )
    assert kept(both) == [[1, 0], [0, 0], [1, 0]]
    assert both.dropped_by[1, 0] == "flat_top_k_rewards+flat_bottom_k_rewards"
    assert both.retained_prompt_ratio == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("draws", "expected"),
    [
        # values row-major [1, 1, 1, 0]; among the 1s the largest draw is kept
        ([0.3, 0.8, 0.1, 0.5], [[0, 1], [0, 0]]),
        ([0.9, 0.8, 0.1, 0.5], [[1, 0], [0, 0]]),
        ([0.3, 0.2, 0.4, 0.0], [[0, 0], [1, 0]]),
    ],
)
def test_flat_top_k_tie_goes_to_the_larger_draw(draws, expected):
    result = filter_rewards(
        np.array([[1.0, 1.0], [1.0, 0.0]]), LbesConfig(flat_top_k_rewards=1), tb(flat=draws)
    )
    assert kept(result) == expected


def test_filters_apply_in_reference_order():
    # top-1 per prompt keeps (0,1)=2 and (1,1)=3 (stable: later of the tied 3s); the flat
    # bottom-1 then sees only those two (2 draws) and keeps 2; prompt 1 ends up empty.
    result = filter_rewards(
        np.array([[1.0, 2.0], [3.0, 3.0]]),
        LbesConfig(top_k_rewards=1, flat_bottom_k_rewards=1),
        tb(flat=[0.5, 0.5]),
    )
    assert kept(result) == [[0, 1], [0, 0]]
    assert result.dropped_by.tolist() == [
        ["top_k_rewards", None],
        ["top_k_rewards", "flat_bottom_k_rewards"],
    ]
    assert result.retained_prompt_ratio == 0.5
    assert result.retained_reward_ratio == 0.25


def test_prompt_var_drop_is_not_overwritten_by_later_filters():
    result = filter_rewards(
        np.array(VAR_REWARDS),
        LbesConfig(top_k_prompt_reward_var=1, top_k_rewards=1, exclude_same_rewards_samples=True),
        tb(prompt_var=[0.5] * 4),
    )
    # prompt 3 (variance 0.75) survives, keeping its top sample (index 0, reward 2)
    assert kept(result) == [[0] * 4, [0] * 4, [0] * 4, [1, 0, 0, 0]]
    assert set(result.dropped_by[1]) == {"top_k_prompt_reward_var"}
    assert result.dropped_by[3].tolist() == [None] + ["top_k_rewards"] * 3


# --------------------------------------------------------------------------- empty batch


def test_everything_filtered_is_empty_and_flat_filter_draws_nothing():
    result = filter_rewards(
        np.array([[1.0, 1.0], [2.0, 2.0]]),
        LbesConfig(exclude_same_rewards_samples=True, flat_top_k_rewards=1),
        tb(),
    )  # FixedDraws(None) fails if the flat filter draws
    assert result.is_empty
    assert result.retained_prompt_ratio == 0.0
    assert result.retained_reward_ratio == 0.0
    assert set(result.dropped_by.ravel()) == {"exclude_same_rewards_samples"}


def test_bad_reward_matrices_are_refused():
    with pytest.raises(ValueError, match="finite"):
        run([[1.0, float("nan")]])
    with pytest.raises(ValueError, match=r"\[prompts, samples\]"):
        filter_rewards(np.array([1.0, 2.0]), LbesConfig(), tb())


def test_reference_tiebreak_seeds_like_the_reference():
    draws = reference_tiebreak(42, 7)
    assert (
        draws.prompt_var.random()
        == np.random.default_rng(derive_seed(42, 7, "prompt_reward_var_tiebreak")).random()
    )
    assert (
        draws.flat.random()
        == np.random.default_rng(derive_seed(42, 7, "flat_reward_tiebreak")).random()
    )
    assert (
        reference_tiebreak(42, 8).flat.random()
        != np.random.default_rng(derive_seed(42, 7, "flat_reward_tiebreak")).random()
    )


# --------------------------------------------------------------------------- correlation

ALL = np.ones((1, 3), dtype=bool)


def test_pearson_hand_computed():
    # x = [1, 2, 3], y = [1, 3, 2]: centred [-1, 0, 1] and [-1, 1, 0]: 1 / (sqrt2 * sqrt2)
    for flat in (True, False):
        assert correlation(
            np.array([[1.0, 2.0, 3.0]]), np.array([[1.0, 3.0, 2.0]]), ALL, flat
        ) == pytest.approx(0.5)


TWO_PROMPTS_R = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]])
TWO_PROMPTS_LL = np.array([[1.0, 3.0, 2.0], [5.0, 1.0, 3.0]])


def test_per_prompt_correlation_is_the_mean_over_prompts():
    # prompt 0: 0.5; prompt 1: centred [-1/3, -1/3, 2/3] and [2, -2, 0]: numerator 0 -> 0
    assert correlation(
        TWO_PROMPTS_R, TWO_PROMPTS_LL, np.ones((2, 3), bool), flat=False
    ) == pytest.approx(0.25)


def test_flat_correlation_pools_all_samples():
    # x mean 7/6, y mean 5/2; sum xc*yc = -1.5, sum xc^2 = 246/36, sum yc^2 = 11.5
    expected = -1.5 / math.sqrt(246 / 36 * 11.5)
    assert correlation(
        TWO_PROMPTS_R, TWO_PROMPTS_LL, np.ones((2, 3), bool), flat=True
    ) == pytest.approx(expected)


def test_zero_variance_prompt_is_nan_and_skipped():
    r = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    ll = np.array([[1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])
    assert correlation(r, ll, np.ones((2, 3), bool), flat=False) == pytest.approx(0.5)


def test_all_prompts_nan_gives_nan():
    r = np.array([[1.0, 1.0], [2.0, 2.0]])
    ll = np.array([[0.1, 0.2], [0.3, 0.4]])
    assert math.isnan(correlation(r, ll, np.ones((2, 2), bool), flat=False))
    assert math.isnan(correlation(r, np.zeros((2, 2)), np.ones((2, 2), bool), flat=True))


def test_only_kept_samples_count():
    r = np.array([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 6.0, 7.0]])
    ll = np.array([[1.0, 3.0, 2.0, np.nan], [np.nan] * 4])
    kept_mask = np.array([[True, True, True, False], [False] * 4])
    for flat in (True, False):
        assert correlation(r, ll, kept_mask, flat) == pytest.approx(0.5)
    assert math.isnan(correlation(r, ll, np.zeros((2, 4), bool), flat=True))


def test_member_correlations_and_their_advantages():
    r = np.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    logliks = np.array(
        [
            [[1.0, 3.0, 2.0], [0.0, 1.0, 2.0]],  # 0.5 (prompt 1 NaN)
            [[3.0, 1.0, 2.0], [0.0, 1.0, 2.0]],  # -0.5
            [[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]],
        ]
    )  # NaN everywhere
    corr = member_correlations(r, logliks, np.ones((2, 3), bool), flat=False)
    np.testing.assert_allclose(corr[:2], [0.5, -0.5])
    assert math.isnan(corr[2])
    # LBES advantages: z-score of the defined correlations; the NaN member gets 0 (skipped)
    # (+-0.5 - 0) / (0.5 + eps)
    np.testing.assert_allclose(zscore(corr), [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0.0])


def test_correlation_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        correlation(np.zeros((2, 3)), np.zeros((3, 2)), np.ones((2, 3), bool), flat=True)


def test_two_samples_a_prompt_correlate_within_one():
    """Two points correlate exactly +-1; the raw quotient overshoots for about a fifth of
    random pairs (1.0000000000000002), which the fitness range must not show."""
    rng = np.random.default_rng(0)
    values = [
        correlation(
            rng.normal(size=(1, 2)),
            rng.normal(size=(1, 2)) * 37.0,
            np.ones((1, 2), dtype=bool),
            flat=False,
        )
        for _ in range(200)
    ]
    assert all(1.0 - 1e-12 < abs(v) <= 1.0 for v in values)
