"""The model's ranking is parsed robustly, and prose is not a ranking."""

from __future__ import annotations

import pytest

from flywheel.society.sao.judge import parse_ranking


@pytest.mark.parametrize(
    ("text", "winner"),
    [
        ("ranking: A > B", "A"),
        ("Ranking: B > A", "B"),
        ("Both are fine, B is clearer.\n**Ranking**: [B] > [A]", "B"),
        ("ranking - Response A > Response B", "A"),
        ("ranking: a>b", "A"),
        ("Final ranking: (B) > (A).", "B"),
        ("B is better.\nB > A", "B"),
        ("ranking: A > B\n\nSo, ranking: A > B", "A"),  # restated, consistent
    ],
)
def test_rankings_are_parsed(text, winner):
    assert parse_ranking(text) == winner


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I think the first response is better because it is more detailed.",
        "ranking: A > A",
        "ranking: A > B ... actually ranking: B > A",
        "A is a better answer than B overall",
        "ranking: C > D",
    ],
)
def test_prose_and_contradictions_are_not_rankings(text):
    assert parse_ranking(text) is None
