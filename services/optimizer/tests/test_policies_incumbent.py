"""policies.incumbent: the Convergence stability rule."""

from __future__ import annotations

from flywheel.optimizer.policies import beta
from flywheel.optimizer.policies.incumbent import choose_incumbent


def _args(stats: dict[str, tuple[float, float]]) -> tuple:
    """arm -> (alpha, beta) as the service stores them; pulls = alpha + beta - 2."""
    ids = list(stats)
    summaries = [beta.summarize(*stats[a]) for a in ids]
    return (
        ids,
        [s.mean for s in summaries],
        [s.ci_low for s in summaries],
        [s.ci_high for s in summaries],
        [stats[a][0] + stats[a][1] - 2 for a in ids],
    )


def test_a_stable_incumbent_is_kept_against_a_small_challenger():
    stats = {"a": (1 + 120, 1 + 80), "b": (1 + 130, 1 + 70)}  # means 0.60 vs 0.65
    assert choose_incumbent("a", *_args(stats)) == "a"


def test_a_challenger_with_a_big_margin_takes_over():
    stats = {"a": (1 + 100, 1 + 100), "b": (1 + 160, 1 + 40)}  # 0.50 vs 0.80
    assert choose_incumbent("a", *_args(stats)) == "b"


def test_an_unproven_challenger_does_not_count():
    stats = {"a": (1 + 100, 1 + 100), "b": (1 + 5, 1 + 0)}  # b looks great after 5 pulls
    assert choose_incumbent("a", *_args(stats)) == "a"


def test_a_wide_interval_reopens_the_choice():
    stats = {"a": (1 + 6, 1 + 6), "b": (1 + 8, 1 + 4)}  # 12 pulls each: intervals ~0.5 wide
    assert choose_incumbent("a", *_args(stats)) == "b"


def test_an_incumbent_below_min_pulls_is_replaced():
    stats = {"a": (1 + 3, 1 + 1), "b": (1 + 60, 1 + 40)}
    assert choose_incumbent("a", *_args(stats)) == "b"


def test_no_current_incumbent_takes_the_best_qualified_mean():
    stats = {"a": (1 + 60, 1 + 40), "b": (1 + 70, 1 + 30), "c": (1 + 9, 1 + 0)}
    assert choose_incumbent(None, *_args(stats)) == "b"
    assert choose_incumbent("gone", *_args(stats)) == "b"


def test_nobody_qualifies():
    stats = {"a": (1 + 3, 1 + 1), "b": (1 + 2, 1 + 2)}
    assert choose_incumbent(None, *_args(stats)) is None


def test_thresholds_are_keyword_arguments():
    stats = {"a": (1 + 120, 1 + 80), "b": (1 + 130, 1 + 70)}
    assert choose_incumbent("a", *_args(stats), min_margin=0.04) == "b"
    assert choose_incumbent("a", *_args(stats), min_pulls=500) is None
