"""Judging a pair: the policy model's own ranking (the paper's "ranking: X > Y" on relevance,
accuracy, completeness and clarity) and the reward judge's Rank in both presentation orders.

The model's answer is parsed strictly enough that prose ("the first one is better") does not
count as a ranking, and loosely enough that markdown, brackets and "Response A" do. A model
that takes ``response_format`` (:func:`~flywheel.society.sao.llm.structured_output`) is asked
for ``{"ranking": "A > B"}`` or ``{"ranking": "B > A"}`` instead (:data:`RANKING_FORMAT`, an
enum the server enforces while generating: small models never write the ranking line on their
own), read by the same parser."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.llm import Llm, Ranker, ask, structured_output

# "ranking: A > B", "**Ranking**: [A] > [B]", "Ranking - Response B > Response A", "ranking: a>b".
_RANKING = re.compile(
    r"ranking\W{0,6}?[:=\-]?\s*\W{0,3}(?:response\s+)?\[?\(?([AB])\b\)?\]?\W{0,3}\s*(?:>|≻|&gt;)\s*"
    r"\W{0,3}(?:response\s+)?\[?\(?([AB])\b",
    re.I,
)
# A line that is nothing but "A > B" (the label left out).
_BARE = re.compile(r"^\W{0,3}(?:response\s+)?([AB])\W{0,3}\s*>\s*\W{0,3}(?:response\s+)?([AB])\W{0,3}$", re.I | re.M)

CRITERIA = "relevance, accuracy, completeness and clarity"
RANKINGS = ("A > B", "B > A")
# OpenAI's response_format for the ranking: one key, one of two values (not "strict": OpenAI's
# strict mode wants every schema rule it knows; servers that enforce schemas take this one).
RANKING_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "ranking",
        "schema": {
            "type": "object",
            "properties": {"ranking": {"type": "string", "enum": list(RANKINGS)}},
            "required": ["ranking"],
            "additionalProperties": False,
        },
    },
}


def ranking_messages(prompt: str, a: str, b: str, *, structured: bool = False) -> list[dict[str, str]]:
    """The ranking request; ``structured``: ask for the JSON of :data:`RANKING_FORMAT` (the
    opening, which bench/sao recognises a ranking request by, is the same either way)."""
    if structured:
        ending = (
            'Answer with JSON only: {"ranking": "A > B"} when response A is better, '
            '{"ranking": "B > A"} when response B is better.'
        )
    else:
        ending = (
            "Explain briefly, then end with one line in exactly this form: ranking: X > Y\n"
            "where X is the letter of the better response (A or B) and Y the other letter."
        )
    return [
        {
            "role": "user",
            "content": (
                f"Compare two responses to the same prompt on {CRITERIA}.\n\n[Prompt]\n{prompt}\n\n"
                f"[Response A]\n{a}\n\n[Response B]\n{b}\n\n{ending}"
            ),
        }
    ]


def _json_ranking(text: str) -> str | None:
    """The "ranking" value of a JSON object answer (code fences allowed), or None if the text
    is not one."""
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    if not body.startswith("{"):
        return None
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    value = data.get("ranking") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def parse_ranking(text: str) -> str | None:
    """The winner ('A' or 'B') of a "ranking: X > Y" answer or a ``{"ranking": "X > Y"}``
    JSON one, or None when there is no ranking, it ranks a response above itself, or two
    rankings contradict each other."""
    value = _json_ranking(text)
    if value is not None:
        text = f"ranking: {value}"
    found = [(x.upper(), y.upper()) for x, y in _RANKING.findall(text)]
    if not found:
        found = [(x.upper(), y.upper()) for x, y in _BARE.findall(text)]
    if not found or any(x == y for x, y in found) or len(set(found)) > 1:
        return None
    return found[0][0]


@dataclass(frozen=True)
class SelfRanking:
    winner: str | None  # "A", "B", or None with ``failure`` set
    failure: str = ""  # llm_timeout | llm_error | llm_empty | llm_rejected_response_format | unparsable_ranking
    text: str = ""


async def self_rank(llm: Llm, prompt: str, a: str, b: str, config: SaoConfig) -> SelfRanking:
    """The policy model ranks its own two responses (greedy, as a judge); as JSON under
    :data:`RANKING_FORMAT` when the model takes ``response_format``."""
    structured = structured_output(llm)
    got = await ask(
        llm,
        ranking_messages(prompt, a, b, structured=structured),
        temperature=0.0,
        max_tokens=config.max_ranking_tokens,
        timeout_s=config.llm_timeout_s,
        response_format=RANKING_FORMAT if structured else None,
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
