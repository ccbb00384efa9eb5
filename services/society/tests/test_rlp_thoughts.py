"""The thoughts prompt and its parser: JSON in prose or fences is read; prose, nothing,
malformed JSON, too few usable thoughts come back as a failure with the reason, never an
exception."""

from __future__ import annotations

import json

import pytest

from flywheel.society.rlp import build_prompt, parse_thoughts

GOOD = {
    "thoughts": [
        {
            "thought": "Temperature 0.7 scored best; nearby values should too.",
            "proposals": [
                {"params": {"temperature": 0.65}, "predicted_score": 0.84, "sigma": 0.03},
                {"params": {"temperature": 0.75}, "predicted_score": "0.82"},
            ],
        },
        {
            "thought": "The larger model has not been tried at low temperature.",
            "proposals": [{"params": {"model": "big", "temperature": 0.2}, "predicted_score": 0.9, "sigma": -1}],
        },
    ]
}


def test_prompt_asks_for_g_thoughts_with_predictions() -> None:
    history = [{"params": {"temperature": 0.2}, "score": 0.5}, {"params": {"temperature": 0.7}, "score": 0.85}]
    messages = build_prompt(
        history=history, search_space={"temperature": [0.0, 1.0]}, n_thoughts=3, proposals_per_thought=2
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Write 3 different thoughts" in user and "predicted_score" in user and "sigma" in user
    assert user.index('{"temperature": 0.7}') < user.index('{"temperature": 0.2}')  # best first
    with pytest.raises(ValueError, match="n_thoughts"):
        build_prompt(history=[], search_space={}, n_thoughts=1)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda s: s,
        lambda s: f"Sure! Here is my answer:\n```json\n{s}\n```\nHope it helps.",
        lambda s: f"Thinking done. {s} That's all.",
    ],
)
def test_json_is_found_in_prose_and_fences(wrap) -> None:
    got = parse_thoughts(wrap(json.dumps(GOOD)))
    assert got.ok and got.failure is None and len(got.thoughts) == 2
    first, second = got.thoughts
    assert first.proposals[0].params == {"temperature": 0.65} and first.proposals[0].sigma == 0.03
    assert first.proposals[1].predicted_score == 0.82 and first.proposals[1].sigma is None  # "0.82" read as a number
    assert second.proposals[0].sigma is None  # a negative sigma is dropped (the default applies)
    assert first.predictions() == {'{"temperature":0.65}': 0.84, '{"temperature":0.75}': 0.82}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (None, "returned nothing"),
        ("", "returned nothing"),
        ("   \n", "returned nothing"),
        ("I think temperature 0.7 will be best, around 0.85.", "no JSON in the answer (prose)"),
        ('{"thoughts": [{"thought": "a", "proposals": [}', "malformed JSON"),
        ('{"ideas": []}', 'no "thoughts" list'),
        ('{"thoughts": []}', "0 usable thought(s), need 2"),
        (42, "not text"),
        ("[" * 5000 + "]" * 5000, "JSON"),
    ],
)
def test_unusable_answers_are_failures_with_a_reason(answer, reason: str) -> None:
    got = parse_thoughts(answer)
    assert not got.ok and reason in got.failure and got.thoughts == []


def test_bad_thoughts_are_dropped_with_reasons() -> None:
    answer = {
        "thoughts": [
            GOOD["thoughts"][0],
            {"thought": "", "proposals": [{"params": {"a": 1}, "predicted_score": 1}]},
            {"thought": "no proposals"},
            {"thought": "nan score", "proposals": [{"params": {"a": 1}, "predicted_score": "NaN"}]},
            {"thought": "empty params", "proposals": [{"params": {}, "predicted_score": 0.3}]},
            {"thought": "bool score", "proposals": [{"params": {"a": 1}, "predicted_score": True}]},
            "just a string",
        ]
    }
    got = parse_thoughts(json.dumps(answer))
    assert not got.ok and "1 usable thought(s), need 2" in got.failure
    assert len(got.dropped) == 6
    assert any("thoughts[3]" in d and "predicted_score" in d for d in got.dropped)
    assert any("thoughts[4]" in d and "params" in d for d in got.dropped)
    assert parse_thoughts(json.dumps(answer), min_thoughts=1).ok


def test_more_thoughts_than_asked_are_cut() -> None:
    many = {"thoughts": GOOD["thoughts"] * 3}
    got = parse_thoughts(json.dumps(many), max_thoughts=4)
    assert got.ok and len(got.thoughts) == 4 and "beyond the 4" in got.dropped[-1]
