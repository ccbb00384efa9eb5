"""flywheel.optimizer.ope: IPS, SNIPS and DR on synthetic logs from known policies with known arm means."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from flywheel.optimizer.ope import (
    LoggedData,
    deterministic,
    doubly_robust,
    effective_sample_size,
    fixed_distribution,
    importance_weights,
    ips,
    on_policy_value,
    per_arm_mean_model,
    snips,
)

MEANS = np.array([0.2, 0.5, 0.35, 0.7])  # true Bernoulli reward rate of each arm
K = len(MEANS)
UNIFORM = np.full(K, 1 / K)
SKEWED = np.array([0.55, 0.25, 0.15, 0.05])  # the best arm (3) is rarely logged
STOCHASTIC_TARGET = np.array([0.1, 0.2, 0.3, 0.4])


def _logs(logging: np.ndarray, n: int, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`reps` independent logs of n decisions from a context-free logging policy."""
    rng = np.random.default_rng(seed)
    actions = rng.choice(K, p=logging, size=(reps, n))
    rewards = (rng.random((reps, n)) < MEANS[actions]).astype(float)
    return actions, rewards, logging[actions]


def _data(actions, rewards, props) -> LoggedData:
    return LoggedData(actions=actions, rewards=rewards, propensities=props, n_arms=K)


def _estimates(estimator: str, logging: np.ndarray, target: np.ndarray, *, n=1000, reps=300, seed=1, **kw):
    """Run one estimator on `reps` independent logs; return (values, ci_lows, ci_highs, std_errors)."""
    out = []
    for a, r, p in zip(*_logs(logging, n, reps, seed), strict=True):
        data = _data(a, r, p)
        probs = fixed_distribution(target, n)
        if estimator == "ips":
            e = ips(data, probs, **kw)
        elif estimator == "snips":
            e = snips(data, probs, **kw)
        elif estimator == "dr":
            e = doubly_robust(data, probs, per_arm_mean_model(data), **kw)
        elif estimator == "dr_true_model":
            e = doubly_robust(data, probs, np.tile(MEANS, (n, 1)), **kw)
        elif estimator == "dr_wrong_model":
            e = doubly_robust(data, probs, np.tile(1 - MEANS, (n, 1)), **kw)
        elif estimator == "logged_mean":  # no reweighting at all: must NOT cover under a skewed logger
            e = on_policy_value(r, **kw)
        else:
            raise AssertionError(estimator)
        out.append((e.value, e.ci_low, e.ci_high, e.std_error))
    return tuple(np.array(col) for col in zip(*out, strict=True))


def _coverage(estimator, logging, target, **kw) -> float:
    _, low, high, _ = _estimates(estimator, logging, target, **kw)
    truth = float(target @ MEANS)
    return float(np.mean((low <= truth) & (truth <= high)))


# --- coverage and bias ---------------------------------------------------------------------

TARGETS = {"always_best_arm": np.eye(K)[3], "stochastic": STOCHASTIC_TARGET}
CASES = [
    pytest.param(est, logging, target, id=f"{est}-{lname}-{tname}")
    for est in ("ips", "snips", "dr")
    for lname, logging in (("uniform", UNIFORM), ("skewed", SKEWED))
    for tname, target in TARGETS.items()
]


@pytest.mark.parametrize(("estimator", "logging", "target"), CASES)
def test_95_percent_intervals_cover_the_true_value_about_95_percent_of_the_time(estimator, logging, target):
    # 300 repetitions: a correct 95% interval covers 285 +/- 3.8 times (binomial sd).
    cov = _coverage(estimator, logging, target)
    assert 0.90 <= cov <= 0.985, f"{estimator}: coverage {cov:.3f}"


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr"])
def test_the_confidence_level_is_honoured_not_hard_coded(estimator):
    cov50 = _coverage(estimator, UNIFORM, STOCHASTIC_TARGET, reps=200, confidence=0.5)
    cov80 = _coverage(estimator, UNIFORM, STOCHASTIC_TARGET, reps=200, confidence=0.8)
    assert 0.40 <= cov50 <= 0.60, cov50  # binomial sd 3.5% at 200 repetitions
    assert 0.70 <= cov80 <= 0.88, cov80  # binomial sd 2.8%


def test_the_coverage_check_can_fail_an_estimator_that_ignores_propensities():
    # The plain logged mean estimates the logger's value, not the target's: its "95%" interval
    # around the wrong quantity almost never covers the target's value.
    assert _coverage("logged_mean", SKEWED, TARGETS["always_best_arm"]) < 0.05


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr", "dr_wrong_model"])
def test_estimates_are_centred_on_the_true_value(estimator):
    values, _, _, se = _estimates(estimator, SKEWED, STOCHASTIC_TARGET, reps=300, seed=3)
    truth = float(STOCHASTIC_TARGET @ MEANS)
    # The mean of 300 estimates has sd ~ se/sqrt(300); allow 4 of those.
    assert abs(values.mean() - truth) < 4 * np.median(se) / math.sqrt(len(values))


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr"])
def test_reported_standard_error_matches_the_spread_of_the_estimates(estimator):
    values, _, _, se = _estimates(estimator, SKEWED, STOCHASTIC_TARGET, reps=300, seed=4)
    assert np.median(se) == pytest.approx(values.std(ddof=1), rel=0.15)


def test_dr_with_a_good_model_has_much_lower_variance_than_ips():
    n = 1000
    ips_values, *_ = _estimates("ips", SKEWED, STOCHASTIC_TARGET, n=n, seed=5)
    dr_true, *_ = _estimates("dr_true_model", SKEWED, STOCHASTIC_TARGET, n=n, seed=5)
    dr_fit, *_ = _estimates("dr", SKEWED, STOCHASTIC_TARGET, n=n, seed=5)
    # Same logs for all three. Per-sample variances in closed form (m = pi^2 / p per arm):
    # IPS: sum m * mu - V^2; DR with the true means: sum m * mu (1 - mu), the reward noise only.
    m = STOCHASTIC_TARGET**2 / SKEWED
    value = STOCHASTIC_TARGET @ MEANS
    sd_ips = math.sqrt((m @ MEANS - value**2) / n)
    sd_dr = math.sqrt((m @ (MEANS * (1 - MEANS))) / n)
    assert sd_dr < 0.65 * sd_ips
    assert ips_values.std() == pytest.approx(sd_ips, rel=0.12)
    assert dr_true.std() == pytest.approx(sd_dr, rel=0.12)
    # The per-arm mean model the service uses, fitted on the same log, does as well.
    assert dr_fit.std() == pytest.approx(sd_dr, rel=0.12)
    assert dr_fit.std() < 0.7 * ips_values.std()


def test_dr_with_a_wrong_model_still_covers():
    assert 0.90 <= _coverage("dr_wrong_model", SKEWED, STOCHASTIC_TARGET, seed=6) <= 0.985


# --- bootstrap intervals -------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr"])
def test_bootstrap_intervals_cover_too(estimator):
    cov = _coverage(estimator, SKEWED, STOCHASTIC_TARGET, n=300, reps=150, seed=8, method="bootstrap", n_bootstrap=300)
    assert 0.88 <= cov <= 0.99, cov


def test_bootstrap_and_normal_intervals_agree_on_a_large_log_and_bootstrap_is_seeded():
    (a, r, p), *_ = zip(*_logs(SKEWED, 10_000, 1, seed=9), strict=True)
    data, probs = _data(a, r, p), fixed_distribution(STOCHASTIC_TARGET, 10_000)
    normal = ips(data, probs)
    boot = ips(data, probs, method="bootstrap", n_bootstrap=600, seed=11)
    assert boot.method == "bootstrap" and normal.method == "normal"
    assert boot.value == normal.value
    assert boot.ci_low == pytest.approx(normal.ci_low, abs=0.15 * normal.std_error * 2)
    assert boot.ci_high == pytest.approx(normal.ci_high, abs=0.15 * normal.std_error * 2)
    again = ips(data, probs, method="bootstrap", n_bootstrap=600, seed=11)
    other = ips(data, probs, method="bootstrap", n_bootstrap=600, seed=12)
    assert (again.ci_low, again.ci_high) == (boot.ci_low, boot.ci_high)
    assert (other.ci_low, other.ci_high) != (boot.ci_low, boot.ci_high)


# --- exact values on a tiny log ------------------------------------------------------------


def _tiny() -> tuple[LoggedData, np.ndarray]:
    data = LoggedData(
        actions=np.array([0, 1, 1, 2]),
        rewards=np.array([1.0, 0.0, 1.0, 0.5]),
        propensities=np.array([0.5, 0.25, 0.25, 0.25]),
        n_arms=3,
    )
    return data, fixed_distribution(np.array([0.2, 0.5, 0.3]), 4)


def test_ips_snips_dr_values_and_normal_intervals_by_hand():
    data, probs = _tiny()
    w = np.array([0.4, 2.0, 2.0, 1.2])
    np.testing.assert_allclose(importance_weights(data, probs), w)
    z = norm.ppf(0.975)

    terms = w * data.rewards  # 0.4, 0, 2, 0.6
    e = ips(data, probs)
    se = terms.std(ddof=1) / 2
    assert (e.estimator, e.value) == ("ips", pytest.approx(0.75))
    assert (e.ci_low, e.ci_high, e.std_error) == pytest.approx((0.75 - z * se, 0.75 + z * se, se))

    s = snips(data, probs)
    v = 3.0 / 5.6
    se = (w * (data.rewards - v)).std(ddof=1) / 2 / w.mean()
    assert (s.estimator, s.value) == ("snips", pytest.approx(v))
    assert (s.ci_low, s.ci_high) == pytest.approx((v - z * se, v + z * se))

    q = np.tile([0.6, 0.4, 0.5], (4, 1))
    d = doubly_robust(data, probs, q)
    dm = 0.2 * 0.6 + 0.5 * 0.4 + 0.3 * 0.5  # 0.47
    dr_terms = dm + w * (data.rewards - np.array([0.6, 0.4, 0.4, 0.5]))
    se = dr_terms.std(ddof=1) / 2
    assert (d.estimator, d.value) == ("dr", pytest.approx(dr_terms.mean()))
    assert (d.ci_low, d.ci_high) == pytest.approx((dr_terms.mean() - z * se, dr_terms.mean() + z * se))

    narrow = ips(data, probs, confidence=0.5)
    assert narrow.ci_high - narrow.ci_low == pytest.approx(2 * norm.ppf(0.75) * e.std_error)


def test_dr_with_a_perfect_model_and_deterministic_target_is_the_model_value():
    data, _ = _tiny()
    target = deterministic(2, data.n, 3)
    q = np.tile([0.0, 0.0, 0.5], (4, 1))  # exact for the one logged sample of arm 2
    d = doubly_robust(data, target, q)
    assert d.value == pytest.approx(0.5) and d.std_error == pytest.approx(0.0)


def test_on_policy_value_is_the_mean_with_its_interval():
    e = on_policy_value(np.array([0.0, 1.0, 1.0, 0.0]), confidence=0.9)
    se = np.std([0, 1, 1, 0], ddof=1) / 2
    assert e.value == 0.5 and e.std_error == pytest.approx(se)
    assert e.ci_high == pytest.approx(0.5 + norm.ppf(0.95) * se)


def test_a_single_sample_has_a_value_but_an_unbounded_interval():
    data = LoggedData(actions=[1], rewards=[1.0], propensities=[0.5], n_arms=2)
    e = ips(data, deterministic(1, 1, 2))
    assert e.value == 2.0 and (e.ci_low, e.ci_high) == (-math.inf, math.inf)


# --- direct model, ESS, target helpers -----------------------------------------------------


def test_per_arm_mean_model_shrinks_toward_the_prior():
    data = LoggedData(actions=[0, 0, 0, 1], rewards=[1.0, 1.0, 0.0, 1.0], propensities=[0.5] * 4, n_arms=3)
    raw = per_arm_mean_model(data, prior_strength=0.0)
    assert raw.shape == (4, 3)
    np.testing.assert_allclose(raw[0], [2 / 3, 1.0, 0.75])  # unseen arm -> prior mean (overall mean)
    shrunk = per_arm_mean_model(data, prior_mean=0.5, prior_strength=2.0)
    np.testing.assert_allclose(shrunk[3], [(2 + 1) / 5, (1 + 1) / 3, 0.5])
    with pytest.raises(ValueError, match="prior_strength"):
        per_arm_mean_model(data, prior_strength=-1.0)


def test_effective_sample_size():
    assert effective_sample_size(np.ones(50)) == pytest.approx(50)
    assert effective_sample_size(np.array([0.0, 0.0, 3.0])) == pytest.approx(1)
    assert effective_sample_size(np.array([1.0, 3.0])) == pytest.approx(16 / 10)
    assert effective_sample_size(np.zeros(3)) == 0.0
    for bad, msg in (([], "empty"), ([1.0, -1.0], ">= 0"), ([1.0, np.nan], "finite"), ([[1.0]], "one-dimensional")):
        with pytest.raises(ValueError, match=msg):
            effective_sample_size(np.array(bad))


def test_target_helpers():
    np.testing.assert_array_equal(deterministic(1, 2, 3), [[0, 1, 0], [0, 1, 0]])
    np.testing.assert_array_equal(deterministic(np.array([2, 0]), 2, 3), [[0, 0, 1], [1, 0, 0]])
    np.testing.assert_allclose(fixed_distribution(np.array([0.25, 0.75]), 3), [[0.25, 0.75]] * 3)
    with pytest.raises(ValueError, match=r"arm_index must lie in \[0, 3\)"):
        deterministic(3, 2, 3)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        deterministic(0, 0, 3)
    with pytest.raises(ValueError, match="sum to 1"):
        fixed_distribution(np.array([0.5, 0.6]), 2)
    with pytest.raises(ValueError, match=">= 0"):
        fixed_distribution(np.array([1.5, -0.5]), 2)


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"propensities": [0.5, 0.0]}, r"propensities must be in \(0, 1\].*propensities\[1\] = 0.0"),
        ({"propensities": [0.5, -0.2]}, r"propensities\[1\] = -0.2"),
        ({"propensities": [0.5, np.nan]}, r"propensities\[1\] is NaN"),
        ({"propensities": [0.5, 1.5]}, r"propensities must be in \(0, 1\]"),
        ({"rewards": [1.0, np.inf]}, "rewards must be finite"),
        ({"rewards": [1.0, 0.0, 1.0]}, "same length"),
        ({"actions": [0, 2]}, r"actions\[1\] = 2 is not an arm index in \[0, 2\)"),
        ({"actions": [0, 0.5]}, "integer arm indices"),
        ({"actions": [[0, 1]]}, "one-dimensional"),
        ({"actions": [], "rewards": [], "propensities": []}, "empty"),
        ({"n_arms": 0}, "n_arms must be a positive integer"),
        ({"logging_probabilities": [[0.5, 0.5], [0.5, 0.5, 0.0]]}, "(numeric|shape)"),
        ({"logging_probabilities": [[0.5, 0.5], [0.5, 0.4]]}, "row 1 sums to 0.9"),
        ({"logging_probabilities": [[0.5, 0.5], [0.7, 0.3]]}, "does not match propensities"),
    ],
)
def test_bad_logged_data_is_rejected_with_a_clear_message(kwargs, message):
    base = {"actions": [0, 1], "rewards": [1.0, 0.0], "propensities": [0.5, 0.5], "n_arms": 2}
    with pytest.raises(ValueError, match=message):
        LoggedData(**{**base, **kwargs})


def test_bad_target_model_and_interval_arguments_are_rejected():
    data, probs = _tiny()
    q = np.zeros((4, 3))
    cases = [
        (lambda: ips(data, probs[:3]), r"target_probs must have shape \(n, n_arms\) = \(4, 3\)"),
        (lambda: ips(data, probs[:, :2] / probs[:, :2].sum(1, keepdims=True)), "shape"),
        (lambda: snips(data, probs * 2), "row 0 sums to 2"),
        (lambda: ips(data, np.where(probs == 0.2, np.nan, probs)), "target_probs must be finite"),
        (lambda: doubly_robust(data, probs, q[:, :2]), "reward_model must have shape"),
        (lambda: doubly_robust(data, probs, np.full((4, 3), np.nan)), "reward_model must be finite"),
        (lambda: ips(data, probs, confidence=1.0), "confidence must be"),
        (lambda: ips(data, probs, confidence=0.0), "confidence must be"),
        (lambda: ips(data, probs, method="jackknife"), "method must be"),
        (lambda: ips(data, probs, method="bootstrap", n_bootstrap=0), "n_bootstrap"),
        (lambda: snips(data, np.eye(3)[[1, 0, 0, 1]]), "SNIPS is undefined"),
        (lambda: on_policy_value(np.array([])), "empty"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_a_target_outside_the_logging_support_is_rejected_when_the_logging_policy_is_known():
    logging = np.array([[0.5, 0.5, 0.0]] * 2)
    data = LoggedData(
        actions=[0, 1], rewards=[1.0, 0.0], propensities=[0.5, 0.5], n_arms=3, logging_probabilities=logging
    )
    ips(data, fixed_distribution(np.array([0.3, 0.7, 0.0]), 2))  # inside the support: fine
    with pytest.raises(ValueError, match="could not choose"):
        ips(data, deterministic(2, 2, 3))
