"""choose_proposals: the k best-predicted proposals, validated against the run's search_space
(out-of-range values and unknown choices dropped, never repaired), deduplicated against the
run's configs and each other, ties kept in thought order."""

from __future__ import annotations

import json

import pytest

from flywheel.society.rlp import ParseResult, ProposedConfig, Thought, parse_thoughts
from flywheel.society.rlp.information_gain import config_key
from flywheel.society.rlp.propose import SpaceError, choose_proposals, read_space, validate_params

SPACE = {
    "parameters": {
        "model": {"type": "categorical", "values": ["small", "big"]},
        "prompt": ["plain", "cot"],  # bare list: categorical
        "temperature": {"type": "continuous", "min": 0.0, "max": 1.0, "step": 0.1},
        "max_tokens": {"type": "discrete", "values": [256, 512, 1024]},
        "top_k": {"type": "int", "min": 1, "max": 50},
        "stream": {"type": "bool", "default": False},
    },
    "templates": {},
}


def cfg(**over: object) -> dict:
    base = {"model": "small", "prompt": "plain", "temperature": 0.5, "max_tokens": 512, "top_k": 10, "stream": False}
    return {**base, **over}


def thought(text: str, *proposals: tuple[dict, float]) -> Thought:
    return Thought(text, [ProposedConfig(p, s, 0.05) for p, s in proposals])


def test_best_predicted_first_across_thoughts() -> None:
    result = ParseResult(
        [
            thought("a", (cfg(temperature=0.1), 0.4), (cfg(temperature=0.2), 0.9)),
            thought("b", (cfg(temperature=0.3), 0.7), (cfg(temperature=0.4), 0.95)),
        ]
    )
    chosen = choose_proposals(result, seen=set(), space=SPACE, k=3)
    assert [(i, p.params["temperature"], p.predicted_score) for i, p in chosen] == [
        (1, 0.4, 0.95),
        (0, 0.2, 0.9),
        (1, 0.3, 0.7),
    ]
    assert all(p.sigma == 0.05 for _, p in chosen)
    assert choose_proposals(result, seen=set(), space=SPACE, k=10)[-1][1].predicted_score == 0.4
    assert choose_proposals(result, seen=set(), space=SPACE, k=0) == []


def test_ties_keep_thought_order() -> None:
    result = ParseResult(
        [
            thought("a", (cfg(top_k=1), 0.8)),
            thought("b", (cfg(top_k=2), 0.8), (cfg(top_k=3), 0.8)),
            thought("c", (cfg(top_k=4), 0.8)),
        ]
    )
    chosen = choose_proposals(result, seen=set(), space=SPACE, k=4)
    assert [(i, p.params["top_k"]) for i, p in chosen] == [(0, 1), (1, 2), (1, 3), (2, 4)]


def test_out_of_range_and_unknown_choices_are_dropped_not_repaired() -> None:
    result = ParseResult(
        [
            thought(
                "bad values",
                (cfg(temperature=1.3), 0.99),  # above max
                (cfg(model="huge"), 0.98),  # not a choice
                (cfg(max_tokens=300), 0.97),  # not a listed number
                (cfg(top_k="many"), 0.96),  # not a number
                ({"model": "big"}, 0.95),  # misses parameters without defaults
            ),
            thought("good", (cfg(model="big"), 0.5)),
        ]
    )
    chosen = choose_proposals(result, seen=set(), space=SPACE, k=5)
    assert [(i, p.params["model"]) for i, p in chosen] == [(1, "big")]


def test_values_are_put_onto_the_space() -> None:
    raw = {
        "model": "big",
        "prompt": "cot",
        "temperature": 0.7000000001,  # snapped to the 0.1 grid
        "max_tokens": "1024",  # a number written as text
        "top_k": 7.0,  # int parameter
        "note": "the model added this",  # not a parameter: removed
    }  # stream missing: its declared default
    [(_, proposal)] = choose_proposals(ParseResult([thought("t", (raw, 0.6))]), seen=set(), space=SPACE, k=1)
    assert proposal.params == {
        "model": "big",
        "prompt": "cot",
        "temperature": 0.7,
        "max_tokens": 1024,
        "top_k": 7,
        "stream": False,
    }
    assert isinstance(proposal.params["top_k"], int)
    assert proposal.key == config_key(proposal.params)


def test_seen_configs_and_repeats_are_skipped() -> None:
    result = ParseResult(
        [
            thought("a", (cfg(temperature=0.2), 0.9), (cfg(temperature=0.3), 0.8)),
            thought("b", (cfg(temperature=0.3), 0.85), (cfg(temperature=0.4), 0.7)),
        ]
    )
    # the run's copy went through protobuf's Struct: every number a float
    from_run = {k: float(v) if type(v) is int else v for k, v in cfg(temperature=0.2).items()}
    seen = {config_key(from_run), "not json"}
    chosen = choose_proposals(result, seen=seen, space=SPACE, k=5)
    assert [(i, p.params["temperature"]) for i, p in chosen] == [(1, 0.3), (1, 0.4)]
    # the same config spelt differently (0.30000001 snaps to 0.3) is a repeat too
    again = ParseResult([thought("c", (cfg(temperature=0.30000001), 0.99))])
    assert choose_proposals(again, seen={p.key for _, p in chosen}, space=SPACE, k=3) == []


def test_failed_parse_gives_nothing_and_parsed_answers_work() -> None:
    assert choose_proposals(parse_thoughts("I think temperature 0.7"), seen=set(), space=SPACE, k=3) == []
    answer = json.dumps(
        {
            "thoughts": [
                {"thought": "bigger model", "proposals": [{"params": cfg(model="big"), "predicted_score": 0.7}]},
                {"thought": "colder", "proposals": [{"params": cfg(temperature=0.0), "predicted_score": "0.75"}]},
            ]
        }
    )
    chosen = choose_proposals(parse_thoughts(answer), seen=set(), space=SPACE, k=2)
    assert [i for i, _ in chosen] == [1, 0]
    assert chosen[1][1].sigma is None


def test_space_forms_and_bad_input() -> None:
    flat = {"t": {"min": 0, "max": 2}, "c": {"choices": [1, "x"]}, "b": {"type": "boolean"}}
    specs = read_space(flat)  # the parameters mapping alone is accepted too
    assert validate_params({"t": 1.234, "c": 1, "b": True}, specs) == ({"t": 1.234, "c": 1, "b": True}, "")
    assert validate_params({"t": 1, "c": True, "b": True}, specs)[1].startswith("c:")  # True is not the choice 1
    assert validate_params({"t": 2.5, "c": "x", "b": False}, specs)[1].startswith("t:")
    with pytest.raises(ValueError, match="k"):
        choose_proposals(ParseResult(), seen=set(), space=SPACE, k=-1)
    with pytest.raises(SpaceError, match=r"search_space\.x"):
        choose_proposals(ParseResult(), seen=set(), space={"x": {"type": "weird"}}, k=1)
    with pytest.raises(SpaceError, match=r"search_space\.y"):
        read_space({"y": {"type": "continuous", "min": 1, "max": 0}})
    with pytest.raises(SpaceError, match="discrete"):
        read_space({"z": {"type": "discrete", "values": ["a"]}})
