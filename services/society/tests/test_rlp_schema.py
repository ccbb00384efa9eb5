"""The thoughts' JSON schema (``response_format``): an answer the parser and the search space
accept follows it, answers the space or the shape would refuse do not, and it bounds every
number and the thought text so a whole answer fits ``thought_length``. Checked with the
``jsonschema`` validator (a dependency of LiteLLM, which the society requires)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from flywheel.society.rlp.propose import choose_proposals
from flywheel.society.rlp.schema import NAME, thought_chars, thoughts_response_format, thoughts_schema
from flywheel.society.rlp.thoughts import parse_thoughts

from .rlp_fakes import SPACE, answer

WIDE = {
    "parameters": {
        "lr": {"type": "float", "min": 1e-5, "max": 0.1, "log": True},
        "layers": {"type": "int", "min": 1, "max": 12},
        "batch": {"type": "discrete", "values": [16, 32, 64]},
        "optimizer": ["adam", "sgd"],
        "warmup": {"type": "bool"},
        "dropout": {"type": "float", "min": 0.05, "max": 0.5, "step": 0.1},
    }
}


def errors(schema: dict, text: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=None)
    return [e.message for e in validator.iter_errors(json.loads(text))]


def schema_for(space=SPACE, *, g=2, p=1, length=500, scores=()) -> dict:
    return thoughts_schema(space, n_thoughts=g, proposals_per_thought=p, thought_length=length, scores=scores)


def test_an_answer_the_society_accepts_follows_the_schema() -> None:
    schema = schema_for()
    jsonschema.Draft202012Validator.check_schema(schema)
    good = answer(("warmer sampling finds better answers", [(0.9, 512, 0.8)]), ("colder is precise", [(0.1, 256, 0.6)]))
    assert errors(schema, good) == []
    parsed = parse_thoughts(good)
    assert parsed.ok and len(choose_proposals(parsed, seen=set(), space=SPACE, k=2)) == 2
    params = schema["properties"]["thoughts"]["items"]["properties"]["proposals"]["items"]["properties"]["params"]
    assert params["properties"]["n"] == {"enum": [128, 256, 512]}
    assert params["properties"]["t"] == {"type": "number", "minimum": 0.0, "maximum": 1.0, "multipleOf": 0.1}
    assert params["required"] == ["t", "n"] and params["additionalProperties"] is False


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (answer(("outside the choices", [(0.5, 100, 0.8)]), ("fine", [(0.1, 256, 0.6)])), "100"),
        (answer(("outside the range", [(1.5, 128, 0.8)]), ("fine", [(0.1, 256, 0.6)])), "1.5"),
        (answer(("off the step grid", [(0.55, 128, 0.8)]), ("fine", [(0.1, 256, 0.6)])), "0.55"),
        (answer(("only one thought", [(0.5, 128, 0.8)])), "short"),
        (answer(("a", [(0.5, 128, 0.8)]), ("fine", [(0.1, 256, 0.6)])), "short"),
        (answer(("score above 1", [(0.5, 128, 1.8)]), ("fine", [(0.1, 256, 0.6)])), "1.8"),
        (answer(("two proposals", [(0.5, 128, 0.8), (0.2, 128, 0.5)]), ("fine", [(0.1, 256, 0.6)])), "long"),
    ],
)
def test_answers_the_space_or_the_shape_refuses_do_not_follow_it(bad: str, why: str) -> None:
    found = errors(schema_for(), bad)
    assert found and any(why in e for e in found), found


def test_every_kind_of_parameter_and_the_numbers_are_bounded() -> None:
    schema = schema_for(WIDE, g=3, p=2, length=900)
    proposal = schema["properties"]["thoughts"]["items"]["properties"]["proposals"]["items"]
    params = proposal["properties"]["params"]["properties"]
    assert params["layers"] == {"type": "integer", "minimum": 1, "maximum": 12}
    assert params["batch"] == {"enum": [16, 32, 64]} and params["optimizer"] == {"enum": ["adam", "sgd"]}
    assert params["warmup"] == {"enum": [True, False]}
    # A grid not anchored at 0 (0.05 + k*0.1) and a log range: decimals fine enough for the
    # low end; the parser snaps onto the real grid.
    assert params["dropout"]["multipleOf"] == 0.0001 and params["lr"]["multipleOf"] == 1e-6
    assert all("minimum" in params[n] and "maximum" in params[n] for n in ("lr", "layers", "dropout"))
    score, sigma = proposal["properties"]["predicted_score"], proposal["properties"]["sigma"]
    assert (score["minimum"], score["maximum"], score["multipleOf"]) == (0.0, 1.0, 0.001)
    assert sigma["exclusiveMinimum"] == 0 and sigma["maximum"] == 1.0
    items = schema["properties"]["thoughts"]
    assert (items["minItems"], items["maxItems"]) == (3, 3)
    assert (proposal_list := items["items"]["properties"]["proposals"])["minItems"] == proposal_list["maxItems"] == 2
    one = {"lr": 0.0003, "layers": 4, "batch": 32, "optimizer": "sgd", "warmup": True, "dropout": 0.25}
    thought = {
        "thought": "small steps with warmup",
        "proposals": [{"params": one, "predicted_score": 0.71, "sigma": 0.05}] * 2,
    }
    assert errors(schema, json.dumps({"thoughts": [thought] * 3})) == []


def test_scores_outside_zero_one_widen_the_predicted_range() -> None:
    schema = schema_for(scores=[-3.0, 12.5, 40.0])
    score = schema["properties"]["thoughts"]["items"]["properties"]["proposals"]["items"]["properties"]
    low, high = score["predicted_score"]["minimum"], score["predicted_score"]["maximum"]
    assert low <= -43.0 and high >= 83.0 and score["predicted_score"]["multipleOf"] == 0.1
    assert schema_for(scores=[0.2, 0.9]) == schema_for()


def test_the_thought_text_leaves_room_for_the_json() -> None:
    assert thought_chars(500, 4, 2, 2) == 3 * ((500 - (6 + 4 * (10 + 2 * (18 + 16)))) // 4)
    assert thought_chars(256, 2, 1, 2) > thought_chars(256, 4, 1, 2) > 0
    assert thought_chars(64, 8, 4, 6) == 24  # too small a budget still asks for some text
    assert thought_chars(8192, 2, 1, 1) == 1200
    text = schema_for(length=256)["properties"]["thoughts"]["items"]["properties"]["thought"]
    assert text == {"type": "string", "minLength": 8, "maxLength": thought_chars(256, 2, 1, 2)}


def test_the_response_format_names_the_schema_and_skips_an_unreadable_space() -> None:
    fmt = thoughts_response_format(SPACE, n_thoughts=2, proposals_per_thought=1, thought_length=300)
    assert fmt is not None and fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == NAME and fmt["json_schema"]["schema"] == schema_for(length=300)
    assert "strict" not in fmt["json_schema"]  # OpenAI's strict mode refuses maxLength and multipleOf
    bad = {"parameters": {"t": {"type": "float", "min": 1.0, "max": 0.0}}}
    assert thoughts_response_format(bad, n_thoughts=2, proposals_per_thought=1, thought_length=300) is None
