"""Hierarchical borrowing between segments, measured by regret against one plain Thompson
sampler per segment, both ways: segments with different best arms (borrowing must not lose,
and the old fixed-strength rule visibly does) and many small alike segments (borrowing wins).

The simulation is vectorized over seeds and uses common random numbers: every rule sees the
same segment sequence and the same reward uniforms, so the ratios are stable to about 1-2%.
Priors are recomputed every ``refresh`` decisions, as the service's segment cache does.
"""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.policies import segments
from flywheel.optimizer.posterior import Stats


def play(p: np.ndarray, rule: str, *, steps: int, seeds: int, cap: float = 10.0, refresh: int = 25) -> float:
    """Mean pseudo-regret over ``seeds`` runs of ``steps`` decisions; segment j arrives uniformly
    and arm a pays 1 with probability p[j, a]. Rules: "independent" (Beta(1, 1) per segment),
    "fixed" (the old rule: the endpoint's evidence capped at ``cap`` pulls), "borrow"
    (`segments.segment_priors`)."""
    n_segments, k = p.shape
    world = np.random.default_rng(7)
    arrivals = world.integers(n_segments, size=(steps, seeds))
    uniforms = world.random((steps, seeds))
    rng = np.random.default_rng(8)
    w = np.zeros((seeds, n_segments, k))
    s = np.zeros_like(w)
    prior_w, prior_s = np.zeros_like(w), np.zeros_like(w)
    rows = np.arange(seeds)
    best = p.max(axis=1)
    regret = np.zeros(seeds)
    for t in range(steps):
        if t % refresh == 0 and rule == "borrow":
            priors = segments.segment_priors(w, s, s, cap)
            prior_w, prior_s = priors.w, priors.s
        elif t % refresh == 0 and rule == "fixed":
            endpoint = Stats(w.sum(axis=1, keepdims=True), s.sum(axis=1, keepdims=True), s.sum(axis=1, keepdims=True))
            borrowed = Stats.zeros(1).with_borrowed(endpoint, cap)
            prior_w = np.broadcast_to(borrowed.w, w.shape)
            prior_s = np.broadcast_to(borrowed.s, w.shape)
        j = arrivals[t]
        a = 1.0 + s[rows, j] + prior_s[rows, j]
        b = 1.0 + (w[rows, j] - s[rows, j]) + (prior_w[rows, j] - prior_s[rows, j])
        arm = rng.beta(a, b).argmax(axis=1)
        w[rows, j, arm] += 1.0
        s[rows, j, arm] += (uniforms[t] < p[j, arm]).astype(float)
        regret += best[j] - p[j, arm]
    return float(regret.mean())


# Each segment has its own best arm.
DIFFER_3 = np.array([[0.7, 0.4, 0.4], [0.4, 0.7, 0.4], [0.4, 0.4, 0.7]])
DIFFER_4 = np.array(
    [[0.8, 0.2, 0.3, 0.3], [0.2, 0.8, 0.3, 0.3], [0.3, 0.2, 0.8, 0.3], [0.3, 0.3, 0.2, 0.8]],
)
# Twenty small segments with the same arms: 30 decisions each.
ALIKE_20 = np.tile([0.3, 0.4, 0.5], (20, 1))


@pytest.mark.parametrize(("world", "limit"), [(DIFFER_3, 1.05), (DIFFER_4, 1.08)], ids=["3-segments", "4-segments"])
def test_segments_that_differ_lose_nothing_to_independent_samplers(world, limit):
    independent = play(world, "independent", steps=1000, seeds=400)
    borrow = play(world, "borrow", steps=1000, seeds=400)
    fixed = play(world, "fixed", steps=1000, seeds=400)
    print(f"regret: independent {independent:.1f}, borrow {borrow:.1f}, old fixed rule {fixed:.1f}")
    assert borrow <= limit * independent
    # The old rule borrows ten pseudo-observations whatever the segments look like: it loses,
    # so this world can tell a rule that adapts from one that does not.
    assert fixed >= 1.3 * independent


def test_many_small_alike_segments_learn_faster_together():
    independent = play(ALIKE_20, "independent", steps=600, seeds=200)
    borrow = play(ALIKE_20, "borrow", steps=600, seeds=200)
    print(f"regret: independent {independent:.1f}, borrow {borrow:.1f}")
    assert borrow <= 0.85 * independent


def test_priors_borrow_the_cap_from_alike_segments_and_nothing_from_different_ones():
    n = np.full((30, 2), 40.0)
    alike = segments.segment_priors(n, np.tile([16.0, 24.0], (30, 1)), np.tile([16.0, 24.0], (30, 1)), cap=10.0)
    np.testing.assert_allclose(alike.w, 10.0)
    np.testing.assert_allclose(alike.s / alike.w, np.tile([0.4, 0.6], (30, 1)))
    s = np.array([[36.0, 4.0], [4.0, 36.0], [36.0, 4.0], [4.0, 36.0]])
    differ = segments.segment_priors(np.full((4, 2), 40.0), s, s, cap=10.0)
    assert differ.w.max() < 0.5
    assert np.all(differ.tau2_hi > 0.1)


def test_prior_mean_leaves_the_segment_out_and_does_not_follow_the_pulls():
    # Arm 0 is pulled a lot where it pays 0.9 and little where it pays 0.1: the pooled endpoint
    # mean says 0.83, the segments' means are far apart, so a third segment's prior sits near
    # their plain average instead.
    w = np.array([[200.0], [20.0], [0.0]])
    s = np.array([[180.0], [2.0], [0.0]])
    priors = segments.segment_priors(w, s, s, cap=10.0)
    assert priors.w[2, 0] == 0.0 or abs(priors.s[2, 0] / priors.w[2, 0] - 0.5) < 0.1
    assert priors.w[0, 0] <= 20.0  # never more than the other groups' own pulls


def test_one_group_borrows_nothing_and_gaussian_priors_keep_the_spread():
    lone = segments.segment_priors(np.array([[10.0, 0.0]]), np.array([[5.0, 0.0]]), np.array([[5.0, 0.0]]), cap=10)
    np.testing.assert_array_equal(lone.w, 0.0)
    rng = np.random.default_rng(1)
    x = rng.normal(2.0, 0.5, size=(40, 50))
    n, total, squares = np.full((40, 1), 50.0), x.sum(axis=1, keepdims=True), (x**2).sum(axis=1, keepdims=True)
    priors = segments.segment_priors(n, total, squares, cap=20.0, kind="gaussian")
    np.testing.assert_allclose(priors.w, 20.0)
    np.testing.assert_allclose(priors.s / priors.w, 2.0, atol=0.05)
    # ss / w - mean^2 is the reward variance: the prior carries the noise as well as the mean
    np.testing.assert_allclose(priors.ss / priors.w - (priors.s / priors.w) ** 2, 0.25, rtol=0.1)


def test_bad_arguments_are_named():
    one = np.ones((2, 2))
    with pytest.raises(ValueError, match="cap"):
        segments.segment_priors(one, one, one, cap=0.0)
    with pytest.raises(ValueError, match="kind"):
        segments.segment_priors(one, one, one, cap=1.0, kind="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        segments.segment_priors(one, one, one, cap=1.0, alpha=1.0)
