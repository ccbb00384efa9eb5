"""policies.selection: Thompson probabilities from draws, caps and floors, sampling from p."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import betainc, betaln

from flywheel.optimizer.policies import beta
from flywheel.optimizer.policies.selection import (
    action_probabilities,
    constrain,
    probability_best,
    sample,
    thompson_probabilities,
)


def test_action_probabilities_count_the_winner_of_each_draw():
    draws = np.array([[0.1, 0.9, 0.5], [0.8, 0.2, 0.5], [0.3, 0.7, 0.1], [0.2, 0.6, 0.4]])
    np.testing.assert_allclose(action_probabilities(draws), [0.25, 0.75, 0.0])
    assert probability_best is action_probabilities


def test_ties_are_split_evenly():
    draws = np.array([[1.0, 1.0, 0.0], [0.5, 0.5, 0.5]])
    np.testing.assert_allclose(action_probabilities(draws), [(0.5 + 1 / 3) / 2, (0.5 + 1 / 3) / 2, (1 / 3) / 2])


def test_probabilities_match_the_exact_thompson_probability():
    a, b = np.array([12.0, 9.0]), np.array([8.0, 11.0])
    x = np.linspace(1e-6, 1 - 1e-6, 20001)
    pdf0 = np.exp((a[0] - 1) * np.log(x) + (b[0] - 1) * np.log1p(-x) - betaln(a[0], b[0]))
    exact = np.trapezoid(pdf0 * betainc(a[1], b[1], x), x)  # P(arm 0 > arm 1)
    p = action_probabilities(beta.draws(a, b, np.random.default_rng(0), 40000))
    assert p.sum() == pytest.approx(1.0)
    assert p[0] == pytest.approx(exact, abs=0.01)


def test_bad_draw_shapes_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        action_probabilities(np.zeros(3))


def test_a_canary_cap_hands_its_excess_to_the_others_in_proportion():
    p = constrain(np.array([0.6, 0.3, 0.1]), caps=np.array([1.0, 1.0, 0.05]))
    np.testing.assert_allclose(p, [0.6 + 0.05 * 2 / 3, 0.3 + 0.05 / 3, 0.05])
    p = constrain(np.array([0.1, 0.2, 0.7]), caps=np.array([1.0, 1.0, 0.1]))  # canary looks best: capped
    np.testing.assert_allclose(p, [0.3, 0.6, 0.1])


def test_capping_one_arm_can_push_another_over_its_cap():
    p = constrain(np.array([0.5, 0.4, 0.1]), caps=np.array([0.2, 0.5, 1.0]))
    np.testing.assert_allclose(p, [0.2, 0.5, 0.3])  # iterated until stable


def test_floor_raises_every_arm_and_keeps_the_order():
    p = constrain(np.array([0.97, 0.03, 0.0, 0.0]), floor=0.05)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(p >= 0.05 - 1e-12)
    assert p[0] > p[1] >= p[2] == p[3]


def test_caps_and_floor_together():
    rng = np.random.default_rng(1)
    for _ in range(200):
        k = int(rng.integers(2, 8))
        p = rng.dirichlet(np.full(k, 0.3))
        caps = np.where(rng.random(k) < 0.3, rng.uniform(0.1, 0.5, k), 1.0)
        floor = float(rng.uniform(0, 0.09)) if k * 0.09 <= 1 else 0.0
        if caps.sum() < 1:
            continue
        out = constrain(p, floor=floor, caps=caps)
        assert out.sum() == pytest.approx(1.0)
        assert np.all(out >= floor - 1e-9)
        assert np.all(out <= caps + 1e-9)


def test_unconstrained_p_is_unchanged():
    p = np.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(constrain(p), p)
    np.testing.assert_allclose(constrain(p, floor=0.1, caps=np.ones(3)), p)


def test_mass_no_arm_with_p_can_take_goes_to_the_others_evenly():
    np.testing.assert_allclose(constrain(np.array([1.0, 0.0, 0.0]), caps=np.array([0.4, 1.0, 1.0])), [0.4, 0.3, 0.3])


@pytest.mark.parametrize(
    ("floor", "caps", "message"),
    [
        (0.4, None, "impossible"),
        (0.2, np.array([0.1, 1.0, 1.0]), "below the exploration floor"),
        (0.0, np.array([0.3, 0.3, 0.3]), "sum to"),
        (0.0, np.array([1.5, 1.0, 1.0]), "caps must be"),
    ],
)
def test_impossible_constraints_are_rejected(floor, caps, message):
    with pytest.raises(ValueError, match=message):
        constrain(np.array([0.5, 0.3, 0.2]), floor=floor, caps=caps)


def test_thompson_probabilities_give_a_capped_arms_excess_to_the_next_best():
    rng = np.random.default_rng(3)
    a, b = np.array([80.0, 20.0, 95.0, 50.0]), np.array([20.0, 80.0, 5.0, 50.0])  # arm 2 (canary) wins always
    d = beta.draws(a, b, rng, 4000)
    p = thompson_probabilities(d, caps=np.array([1.0, 1.0, 0.1, 1.0]))
    np.testing.assert_allclose(p, [0.9, 0.0, 0.1, 0.0], atol=1e-9)  # proportional-to-p could not know arm 0
    np.testing.assert_allclose(thompson_probabilities(d), action_probabilities(d))
    p = thompson_probabilities(d, floor=0.02, caps=np.array([0.5, 1.0, 0.1, 1.0]))  # arm 0 capped too
    assert p.sum() == pytest.approx(1.0) and p[0] <= 0.5 + 1e-12 and p[2] <= 0.1 + 1e-12
    assert p[3] > p[1] >= 0.02  # arm 3 (0.5) takes what is left before arm 1 (0.2)


def test_sample_follows_p():
    rng = np.random.default_rng(2)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    counts = np.bincount([sample(p, rng) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, p, atol=0.015)
    assert counts[1] == 0
