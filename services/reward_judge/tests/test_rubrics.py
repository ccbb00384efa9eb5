"""Rubric presets and validation."""

from __future__ import annotations

import pytest

from flywheel.core.errors import InvalidArgument
from flywheel.reward_judge import rubric


def test_presets_ship_and_are_valid():
    presets = rubric.presets()
    assert set(presets) == set(rubric.PRESETS)
    for r in presets.values():
        assert r.preset and r.version == 1 and r.criteria
        assert rubric.from_yaml(r.to_yaml()).criteria == r.criteria  # YAML round trip


GOOD = "name: refunds\ndescription: d\ncriteria:\n  - {name: policy, description: follows policy, weight: 2}\n"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [oops", "does not parse"),
        ("- just a list", "must be a mapping"),
        (GOOD.replace("refunds", "Has Space"), "name must match"),
        (GOOD + "extra: 1\n", "unknown keys ['extra']"),
        ("name: x\ncriteria: []\n", "at least one criterion"),
        ("name: x\ncriteria: 3\n", "must be a list"),
        (GOOD.replace("weight: 2", "weight: 0"), "weight must be a finite number > 0"),
        (GOOD.replace("weight: 2", "weight: .nan"), "weight must be a finite number > 0"),
        (GOOD.replace("weight: 2", "weight: lots"), "weight must be a number"),
        (GOOD.replace("description: follows policy", "description: ''"), "needs a description"),
        (GOOD.replace("name: policy", "name: Policy!"), "criterion name"),
        (GOOD + "  - {name: policy, description: again, weight: 1}\n", "appears twice"),
        (GOOD.replace("name: refunds", "name: refunds\nversion: -2"), "version must be >= 0"),
    ],
)
def test_bad_rubrics_are_refused_with_what_to_fix(text, words):
    with pytest.raises(InvalidArgument) as exc:
        rubric.from_yaml(text)
    assert words in str(exc.value)


def test_a_good_rubric_parses():
    r = rubric.from_yaml(GOOD)
    assert r.name == "refunds" and r.weights() == {"policy": 2.0} and not r.preset
