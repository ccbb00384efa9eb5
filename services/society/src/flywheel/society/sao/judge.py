"""Judging a pair: the policy model's own ranking (the paper's "ranking: X > Y" on relevance,
accuracy, completeness and clarity) and the reward judge's Rank in both presentation orders.

The model's answer is parsed strictly enough that prose ("the first one is better") does not
count as a ranking, and loosely enough that markdown, brackets and "Response A" do."""

from __future__ import annotations

import re
from dataclasses import dataclass

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.llm import Llm, Ranker, ask

# "ranking: A > B", "**Ranking**: [A] > [B]", "Ranking - Response B > Response A", "ranking: a>b".
_RANKING = re.compile(
    r"ranking\W{0,6}?[:=\-]?\s*\W{0,3}(?:response\s+)?\[?\(?([AB])\b\)?\]?\W{0,3}\s*(?:>|≻|&gt;)\s*"
    r"\W{0,3}(?:response\s+)?\[?\(?([AB])\b",
    re.I,
)
# A line that is nothing but "A > B" (the label left out).
_BARE = re.compile(r"^\W{0,3}(?:response\s+)?([AB])\W{0,3}\s*>\s*\W{0,3}(?:response\s+)?([AB])\W{0,3}$", re.I | re.M)

CRITERIA = "relevance, accuracy, completeness and clarity"


def ranking_messages(prompt: str, a: str, b: str) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": (
                f"Compare two responses to the same prompt on {CRITERIA}.\n\n[Prompt]\n{prompt}\n\n"
                f"[Response A]\n{a}\n\n[Response B]\n{b}\n\n"
                "Explain briefly, then end with one line in exactly this form: ranking: X > Y\n"
                "where X is the letter of the better response (A or B) and Y the other letter."
            ),
        }
    ]


def parse_ranking(text: str) -> str | None:
    """The winner ('A' or 'B') of a "ranking: X > Y" answer, or None when there is no
    ranking, it ranks a response above itself, or two rankings contradict each other."""
    found = [(x.upper(), y.upper()) for x, y in _RANKING.findall(text)]
    if not found:
        found = [(x.upper(), y.upper()) for x, y in _BARE.findall(text)]
    if not found or any(x == y for x, y in found) or len(set(found)) > 1:
        return None
    return found[0][0]


@dataclass(frozen=True)
class SelfRanking:
    winner: str | None  # "A", "B", or None with ``failure`` set
    failure: str = ""  # llm_timeout | llm_error | llm_empty | unparsable_ranking
    text: str = ""


async def self_rank(llm: Llm, prompt: str, a: str, b: str, config: SaoConfig) -> SelfRanking:
    """The policy model ranks its own two responses (greedy, as a judge)."""
    got = await ask(
        llm,
        ranking_messages(prompt, a, b),
        temperature=0.0,
        max_tokens=config.max_ranking_tokens,
        timeout_s=config.llm_timeout_s,
    )
    if got.failure:
        return SelfRanking(None, got.failure, got.detail)
    winner = parse_ranking(got.text)
    if winner is None:
        return SelfRanking(None, "unparsable_ranking", got.text[:200])
    return SelfRanking(winner, text=got.text[:200])


@dataclass(frozen=True)
class JudgeVerdict:
    """The reward judge's Rank of (A, B) and of (B, A), mapped back to A and B."""

    forward: tuple[float, float]  # (score of A, score of B) when A was listed first
    swapped: tuple[float, float]  # (score of A, score of B) when B was listed first
    forward_winner: str | None
    swapped_winner: str | None
    failure: str = ""  # judge_unavailable
    detail: str = ""

    @property
    def agreed(self) -> bool:
        return self.forward_winner is not None and self.forward_winner == self.swapped_winner

    @property
    def winner(self) -> str | None:
        return self.forward_winner if self.agreed else None

    def mean(self, label: str) -> float:
        i = 0 if label == "A" else 1
        return (self.forward[i] + self.swapped[i]) / 2


def _winner(score_a: float, score_b: float, margin: float) -> str | None:
    if score_a - score_b > margin:
        return "A"
    if score_b - score_a > margin:
        return "B"
    return None


async def judge_both_orders(ranker: Ranker, prompt: str, a: str, b: str, config: SaoConfig) -> JudgeVerdict:
    """Rank (A, B), then (B, A), one after the other, so each order is its own judgement."""
    try:
        fa, fb = await ranker.rank(prompt, [a, b], config.judge_rubric)
        sb, sa = await ranker.rank(prompt, [b, a], config.judge_rubric)
    except Exception as exc:  # noqa: BLE001 - JudgeUnavailable or a transport error: the pair is dropped, counted
        detail = f"{type(exc).__name__}: {exc}"[:300]
        return JudgeVerdict((0.0, 0.0), (0.0, 0.0), None, None, "judge_unavailable", detail)
    m = config.judge_min_margin
    return JudgeVerdict((fa, fb), (sa, sb), _winner(fa, fb, m), _winner(sa, sb, m))
