"""Win rate of the trained policy against its base from verdicts in both orders: a win or a
loss only when both orders name the same winner, a tie otherwise. Wilson 95% interval of the
decisive win rate, and the two-sided sign test on wins against losses (ties left out)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learning"))

# bench/learning/stats.py: the exact binomial test on discordant pairs.
from stats import mcnemar_exact

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: under H0 wins ~ Binomial(wins + losses, 1/2)."""
    return mcnemar_exact(wins, losses)


@dataclass(frozen=True)
class WinRate:
    n: int
    wins: int
    losses: int
    ties: int  # both orders tied, or the orders named different winners
    order_disagreements: int  # of the ties: the two orders named different winners
    win_rate: float  # wins / (wins + losses); 0.5 when there is no decisive prompt
    ci_low: float
    ci_high: float
    win_rate_ties_half: float  # (wins + ties / 2) / n
    sign_test_p: float


def outcome(verdict: object, trained_label: str) -> str:
    """'win', 'loss', 'tie' or 'disagree' for the trained response listed as ``trained_label``
    (a ``flywheel.society.sao.judge.JudgeVerdict``)."""
    forward, swapped = verdict.forward_winner, verdict.swapped_winner  # type: ignore[attr-defined]
    if forward is not None and forward == swapped:
        return "win" if forward == trained_label else "loss"
    if forward is None and swapped is None:
        return "tie"
    return "disagree"


def win_rate(outcomes: list[str]) -> WinRate:
    wins, losses = outcomes.count("win"), outcomes.count("loss")
    disagree = outcomes.count("disagree")
    ties = outcomes.count("tie") + disagree
    n = len(outcomes)
    decisive = wins + losses
    lo, hi = wilson(wins, decisive)
    return WinRate(
        n=n,
        wins=wins,
        losses=losses,
        ties=ties,
        order_disagreements=disagree,
        win_rate=wins / decisive if decisive else 0.5,
        ci_low=lo,
        ci_high=hi,
        win_rate_ties_half=(wins + ties / 2) / n if n else 0.5,
        sign_test_p=sign_test(wins, losses),
    )
