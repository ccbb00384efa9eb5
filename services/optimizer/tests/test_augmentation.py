"""Test-case augmentation: Convergence's settings, seeded variants, and labels kept true."""

from __future__ import annotations

import re

import pytest

from flywheel.optimizer.runconfig import RunConfigError, parse_run_config
from flywheel.optimizer.runconfig.augmentation import AugmentationConfig, augment, diversity

LABELLED = [
    {"id": "add", "input": "Calculate the total cost of 15 apples at 2 dollars each.", "expected": "30"},
    {"id": "cap", "input": {"prompt": "Find the capital of France. Give a short answer."}, "expected": "Paris"},
]
OPEN = [
    {"id": "plan", "input": "Write a short plan for 3 days in Rome. Explain the main problem."},
    {"id": "fix", "input": "Explain how to fix a slow laptop. Make a quick list of 5 checks."},
    {"id": "buy", "input": "I need to buy a big tent for 4 people. What should I check first?"},
]


def config(cases, **augmentation):
    return {
        "api": {"name": "t", "model": "openai/x", "api_base": "http://127.0.0.1:1/v1"},
        "search_space": {"parameters": {"temperature": {"type": "float", "min": 0.0, "max": 1.0}}},
        "evaluation": {
            "test_cases": {"inline": cases, "augmentation": augmentation},
            "metrics": {"quality": {"type": "llm_judge", "weight": 1.0}},
        },
    }


def numbers(value) -> list[str]:
    return re.findall(r"\d+", str(value))


def test_off_by_default_and_when_disabled():
    assert [c.id for c in parse_run_config(config(OPEN)).test_cases()] == ["plan", "fix", "buy"]
    assert len(parse_run_config(config(OPEN, enabled=False, augmentation_factor=3)).test_cases()) == 3


def test_variants_follow_the_originals_with_provenance_and_the_same_seed_gives_the_same_cases():
    parsed = parse_run_config(config(LABELLED + OPEN, enabled=True, augmentation_factor=2, mutation_rate=0.5))
    cases = parsed.test_cases()
    assert [c.id for c in cases[:5]] == ["add", "cap", "plan", "fix", "buy"]
    variants = cases[5:]
    assert 5 <= len(variants) <= 10
    originals = {c.id: c for c in cases[:5]}
    for v in variants:
        source = v.metadata["augmented_from"]
        assert v.id.startswith(f"{source}~aug")
        assert v.input != originals[source].input
        assert v.metadata["augmentation"]
    assert len({repr(c.input) for c in cases}) == len(cases)  # no duplicate inputs
    again = parse_run_config(config(LABELLED + OPEN, enabled=True, augmentation_factor=2, mutation_rate=0.5))
    assert [c.model_dump() for c in again.test_cases()] == [c.model_dump() for c in cases]
    other_seed = parse_run_config(
        config(LABELLED + OPEN, enabled=True, augmentation_factor=2, mutation_rate=0.5, seed=7)
    )
    assert [c.model_dump() for c in other_seed.test_cases()] != [c.model_dump() for c in cases]


def test_a_labelled_case_keeps_its_numbers_and_expected_answer():
    """The Convergence scaled "15 apples" and kept "expected: 30": a wrong label. Only wording changes here."""
    out = augment(
        LABELLED, AugmentationConfig(enabled=True, augmentation_factor=5, mutation_rate=1.0, crossover_rate=1.0)
    )
    variants = [c for c in out if "augmented_from" in c.get("metadata", {})]
    assert variants
    for v in variants:
        source = next(c for c in LABELLED if c["id"] == v["metadata"]["augmented_from"])
        assert v["expected"] == source["expected"]
        assert numbers(v["input"]) == numbers(source["input"])
        assert set(v["metadata"]["augmentation"]) <= {"synonym", "emphasis"}


def test_unlabelled_cases_get_numbers_scaled():
    out = augment(OPEN, AugmentationConfig(enabled=True, augmentation_factor=2, mutation_rate=1.0, crossover_rate=0))
    variants = [c for c in out if "augmented_from" in c.get("metadata", {})]
    assert any("numbers" in v["metadata"]["augmentation"] for v in variants)
    assert any(numbers(v["input"]) != numbers(next(o for o in OPEN if o["id"] == v["id"].split("~")[0])["input"])
               for v in variants)  # fmt: skip


def test_crossover_joins_the_first_sentence_of_one_case_to_the_last_of_another():
    out = augment(OPEN, AugmentationConfig(enabled=True, augmentation_factor=2, mutation_rate=0, crossover_rate=1.0))
    first = {c["id"]: c["input"].split(". ")[0] for c in OPEN}
    last = {c["input"].split(". ", 1)[1] for c in OPEN}
    variants = [c for c in out if "augmented_from" in c.get("metadata", {})]
    assert variants
    for v in variants:
        assert v["metadata"]["augmentation"] == ["crossover"]
        head, tail = v["input"].split(". ", 1)
        assert head == first[v["metadata"]["augmented_from"]] and tail in last


def test_without_preserve_originals_only_variants_remain():
    out = augment(OPEN, AugmentationConfig(enabled=True, augmentation_factor=1, preserve_originals=False))
    assert len(out) == 3
    assert all("~aug1" in c["id"] or c["id"] in {"plan", "fix", "buy"} for c in out)


def test_diversity_is_zero_for_copies_and_high_for_unrelated_cases():
    assert diversity([{"input": "a b c"}, {"input": "a b c"}]) == 0.0
    assert diversity([{"input": "red apples"}, {"input": "blue sky"}]) == 1.0


@pytest.mark.parametrize(
    ("augmentation", "field"),
    [
        ({"enabled": True, "mutation_rate": 2}, "evaluation.test_cases.augmentation.mutation_rate"),
        ({"enabled": True, "augmentation_factor": 0}, "evaluation.test_cases.augmentation.augmentation_factor"),
        ({"enabled": True, "factor": 2}, "evaluation.test_cases.augmentation.factor"),
    ],
)
def test_bad_settings_name_the_field(augmentation, field):
    with pytest.raises(RunConfigError) as info:
        parse_run_config(config(OPEN, **augmentation))
    assert any(p.startswith(field) for p in info.value.problems), info.value.problems
