"""Population seeds, update coefficients and merged update terms."""

import hashlib

import numpy as np
import pytest

from engine.es import Member, population, update_coefficients, update_terms
from engine.noise import member_seed


def test_member_seed_is_the_lbes_hash():
    # sha256("42_3_1"), first 4 bytes big-endian, mod 2**31 (lbes derive_seed)
    expected = int.from_bytes(hashlib.sha256(b"42_3_1").digest()[:4], "big") % 2**31
    assert population(42, 3, 2, antithetic=False)[1].seed == expected


def test_population_plain():
    members = population(42, 3, 4, antithetic=False)
    assert members == [Member(i, member_seed(42, 3, i), +1) for i in range(4)]
    assert len({m.seed for m in members}) == 4
    # seeds depend on the step
    assert {m.seed for m in population(42, 4, 4, False)}.isdisjoint({m.seed for m in members})


def test_population_antithetic_pairs_share_a_seed():
    members = population(7, 0, 4, antithetic=True)
    s0, s1 = member_seed(7, 0, 0), member_seed(7, 0, 1)
    assert [(m.index, m.seed, m.sign) for m in members] == [
        (0, s0, +1),
        (1, s0, -1),
        (2, s1, +1),
        (3, s1, -1),
    ]


def test_population_refuses_odd_antithetic_and_empty():
    with pytest.raises(ValueError, match="even"):
        population(1, 0, 3, antithetic=True)
    with pytest.raises(ValueError, match=">= 1"):
        population(1, 0, 0, antithetic=False)


def test_update_coefficients_scale_sign_and_nan():
    # lr / (N * sigma) = 0.4 / (4 * 0.1) = 1
    coefs = update_coefficients(np.array([1.0, -1.0, 0.5, np.nan]), [1, 1, -1, 1], 0.4, 0.1)
    np.testing.assert_allclose(coefs, [1.0, -1.0, -0.5, 0.0])


def test_update_coefficients_reference_magnitude():
    # lbes defaults: 5e-7 / (32 * 1e-3) = 1.5625e-5 per unit advantage
    coefs = update_coefficients(np.ones(32), [1] * 32, 5e-7, 1e-3)
    np.testing.assert_allclose(coefs, np.full(32, 1.5625e-5), rtol=1e-12)


def test_update_coefficients_lr_zero_gives_zeros():
    assert np.array_equal(update_coefficients(np.array([1.0, -1.0]), [1, 1], 0.0, 0.1), np.zeros(2))


def test_update_coefficients_checks():
    with pytest.raises(ValueError, match="2 advantages for 3 signs"):
        update_coefficients(np.array([1.0, 2.0]), [1, 1, 1], 0.1, 0.1)
    with pytest.raises(ValueError, match="noise_std must be > 0"):
        update_coefficients(np.array([1.0, 2.0]), [1, 1], 0.1, 0.0)


def test_update_terms_merge_antithetic_pairs():
    members = population(5, 2, 4, antithetic=True)
    s0, s1 = members[0].seed, members[2].seed
    # A = [1, -1, 0.5, 0.5], signs [+, -, +, -], scale 1:
    # seed 0: 1 * 1 + (-1) * (-1) = 2; seed 1: 0.5 - 0.5 = 0 -> dropped
    coefs = update_coefficients(
        np.array([1.0, -1.0, 0.5, 0.5]), [m.sign for m in members], 0.4, 0.1
    )
    assert update_terms(members, coefs) == [(s0, 2.0)]
    assert s1 not in dict(update_terms(members, coefs))


def test_update_terms_plain_keeps_order_and_drops_zeros():
    members = population(5, 2, 3, antithetic=False)
    terms = update_terms(members, np.array([0.25, 0.0, -0.5]))
    assert terms == [(members[0].seed, 0.25), (members[2].seed, -0.5)]


def test_update_terms_length_mismatch():
    with pytest.raises(ValueError, match="1 coefficients for 2 members"):
        update_terms(population(5, 2, 2, False), np.array([1.0]))
