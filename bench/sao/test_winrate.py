"""Fast checks of the bench's statistics and call routing (no model is loaded):
``.venv/bin/python -m pytest bench/sao/test_winrate.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policy
import winrate

from flywheel.society.sao.judge import JudgeVerdict, ranking_messages


def verdict(forward: str | None, swapped: str | None) -> JudgeVerdict:
    return JudgeVerdict((0.0, 0.0), (0.0, 0.0), forward, swapped)


def test_wilson_matches_the_textbook_values():
    assert winrate.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert winrate.wilson(13, 19) == pytest.approx((0.4601, 0.8464), abs=1e-4)
    assert winrate.wilson(0, 0) == (0.0, 1.0)


def test_a_win_needs_both_orders():
    assert winrate.outcome(verdict("A", "A"), "A") == "win"
    assert winrate.outcome(verdict("B", "B"), "A") == "loss"
    assert winrate.outcome(verdict("A", "B"), "A") == "disagree"
    assert winrate.outcome(verdict("A", None), "A") == "disagree"
    assert winrate.outcome(verdict(None, None), "A") == "tie"


def test_win_rate_counts_disagreements_as_ties():
    w = winrate.win_rate(["win"] * 6 + ["loss"] * 2 + ["tie", "disagree"])
    assert (w.n, w.wins, w.losses, w.ties, w.order_disagreements) == (10, 6, 2, 2, 1)
    assert w.win_rate == 0.75 and w.win_rate_ties_half == pytest.approx(0.7)
    assert w.sign_test_p == pytest.approx(2 * (1 + 8 + 28) / 256)


def test_only_the_librarys_ranking_request_is_a_forced_choice():
    assert policy.is_ranking(ranking_messages("How do I bake bread?", "first", "second"))
    assert not policy.is_ranking([{"role": "user", "content": "How do I bake bread?"}])
