"""Strict parsing and bounded repair of the judge's JSON answer."""

from __future__ import annotations

import json

import pytest

from flywheel.reward_judge.parsing import MalformedAnswer, extract_json, read_scores

VALID = {"scores": [{"id": "R1", "criteria": {"a": 7, "b": 3}, "explanation": "ok"}, {"id": "R2", "score": 10}]}
IDS, CRITERIA = ["R1", "R2"], ["a", "b"]


def test_valid_json_parses_without_repair():
    parsed = extract_json(json.dumps(VALID))
    assert not parsed.repaired and parsed.data == VALID
    scores = read_scores(parsed.data, ids=IDS, criteria=CRITERIA)
    assert scores["R1"].criteria == {"a": 0.7, "b": 0.3}
    assert scores["R2"].criteria == {"overall": 1.0}


@pytest.mark.parametrize(
    "text",
    [
        "Sure! Here it is:\n```json\n" + json.dumps(VALID) + "\n```\nAnything else?",
        "My verdict: " + json.dumps(VALID) + " -- done",
        json.dumps(VALID)[:-2] + ",]}",  # trailing comma
        json.dumps(VALID)[:-2],  # cut before the closing brackets
        json.dumps(VALID).replace('"', "'"),  # single quotes
        json.dumps(VALID).replace("\u0022ok\u0022", "\u201cok\u201d"),  # smart quotes
    ],
)
def test_common_damage_is_repaired(text):
    parsed = extract_json(text)
    assert parsed.repaired
    assert read_scores(parsed.data, ids=IDS, criteria=CRITERIA)["R1"].criteria == {"a": 0.7, "b": 0.3}


def test_python_literals_are_repaired():
    parsed = extract_json('{"scores": [], "final": True, "note": None}')
    assert parsed.data == {"scores": [], "final": True, "note": None}


def test_an_answer_cut_mid_item_is_repaired_into_a_partial_answer_that_is_refused():
    text = json.dumps(VALID)
    cut = text[: text.index('"b"') + 5]  # ... "criteria": {"a": 7, "b":
    parsed = extract_json(cut)
    with pytest.raises(MalformedAnswer, match="criteria"):
        read_scores(parsed.data, ids=IDS, criteria=CRITERIA)


def test_cut_inside_a_string_is_closed():
    parsed = extract_json('{"scores": [{"id": "R1", "score": 5, "explanation": "because it is')
    assert parsed.data["scores"][0]["explanation"] == "because it is"


@pytest.mark.parametrize("text", ["I prefer the first one.", "", "[1, 2, 3]"])
def test_no_object_is_malformed(text):
    with pytest.raises(MalformedAnswer, match="no JSON object"):
        extract_json(text)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"verdict": 1}, 'no "scores" list'),
        ({"scores": [{"id": "R1", "score": 5}]}, "['R2'] are not scored"),
        ({"scores": [{"id": "R9", "score": 5}]}, "unknown id 'R9'"),
        ({"scores": [{"id": "R1", "score": 5}, {"id": "R1", "score": 5}]}, "scored twice"),
        ({"scores": [{"id": "R1", "score": 11}, {"id": "R2", "score": 1}]}, "outside 0-10"),
        ({"scores": [{"id": "R1", "score": -1}, {"id": "R2", "score": 1}]}, "outside 0-10"),
        ({"scores": [{"id": "R1", "score": "high"}, {"id": "R2", "score": 1}]}, "not a number"),
        ({"scores": [{"id": "R1", "score": True}, {"id": "R2", "score": 1}]}, "boolean"),
        ({"scores": [{"id": "R1", "score": float("nan")}, {"id": "R2", "score": 1}]}, "outside"),
        ({"scores": [{"id": "R1", "criteria": {"a": 1}}, {"id": "R2", "score": 1}]}, "['b'] are missing"),
        ({"scores": [{"id": "R1"}, {"id": "R2", "score": 1}]}, "neither criteria nor score"),
        ({"scores": ["R1", "R2"]}, "not an object"),
    ],
)
def test_wrong_shapes_are_refused_with_the_reason(data, words):
    with pytest.raises(MalformedAnswer) as exc:
        read_scores(data, ids=IDS, criteria=CRITERIA)
    assert words in str(exc.value)


def test_numeric_strings_are_accepted():
    got = read_scores({"scores": [{"id": "R1", "score": "8"}, {"id": "R2", "score": 2.5}]}, ids=IDS, criteria=CRITERIA)
    assert got["R1"].criteria["overall"] == 0.8 and got["R2"].criteria["overall"] == 0.25
