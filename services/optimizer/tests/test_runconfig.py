"""Run config: Convergence's forms and shorthands load; bad configs name the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flywheel.optimizer.runconfig import RunConfigError, load_run_config, parse_run_config
from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE

EXAMPLE = Path(__file__).parents[1] / "examples" / "capitals" / "optimization.yaml"


def base(**overrides):
    config = {
        "api": {"name": "t", "model": "openai/x", "api_base": "http://127.0.0.1:1/v1"},
        "search_space": {"parameters": {"temperature": {"type": "float", "min": 0.0, "max": 1.0}}},
        "evaluation": {
            "test_cases": [{"input": "2+2?", "expected": "4"}],
            "metrics": {"quality": {"type": "exact_match", "weight": 1.0}},
        },
    }
    config.update(overrides)
    return config


def problems(data) -> list[str]:
    with pytest.raises(RunConfigError) as info:
        parse_run_config(data)
    return info.value.problems


def test_the_shipped_example_loads_with_its_test_cases():
    config = load_run_config(EXAMPLE)
    cases = config.test_cases(EXAMPLE.parent)
    assert len(cases) >= 10
    assert len({c.id for c in cases}) == len(cases)
    space = config.search_space.to_space()
    assert [p.kind for p in space.params] == [CATEGORICAL, CONTINUOUS, CONTINUOUS, DISCRETE]
    assert config.evaluation.metrics["latency_ms"].type == "latency"
    assert config.evaluation.metrics["latency_ms"].direction == "lower_is_better"
    settings = config.optimization.search_settings()
    assert (settings.population_size, settings.elite_size, settings.patience) == (5, 1, 2)


def test_convergence_yaml_reference_form_is_accepted():
    data = base(
        api={"name": "x", "endpoint": "https://api.example.com/v1/chat", "auth": {"type": "bearer", "token_env": "K"}},
        search_space={
            "parameters": {
                "model": {"type": "categorical", "values": ["a", "b"]},
                "temperature": {"type": "continuous", "min": 0.0, "max": 2.0, "step": 0.1},
                "max_tokens": {"type": "discrete", "values": [512, 256]},
            }
        },
        evaluation={
            "test_cases": {"inline": [{"input": "q", "expected": "a", "metadata": {"k": 1}}]},
            "metrics": {
                "response_quality": {"weight": 0.4, "type": "higher_is_better", "function": "similarity"},
                "latency_ms": {"weight": 0.3, "type": "lower_is_better"},
                "cost_per_call": {"weight": 0.3, "type": "lower_is_better", "budget_per_call": 0.1},
            },
        },
        optimization={
            "algorithm": "mab_evolution",
            "evolution": {"population_size": 10, "generations": 5, "mutation_rate": 0.3, "elite_size": 2},
            "execution": {"parallel_workers": 5, "early_stopping": {"enabled": True, "patience": 3}},
        },
        society={"enabled": True, "learning": {"rlp_enabled": True, "sao_enabled": True}},
        output={"save_path": "./results"},
    )
    config = parse_run_config(data)
    m = config.evaluation.metrics
    assert (m["response_quality"].type, m["latency_ms"].type, m["cost_per_call"].type) == (
        "similarity",
        "latency",
        "cost",
    )
    assert m["cost_per_call"].direction == "lower_is_better"
    assert config.api.kind == "http"
    assert config.optimization.search_settings().patience == 3
    assert config.search_space.to_space().params[2].values == (256, 512)
    assert config.evaluation.weights()["response_quality"] == pytest.approx(0.4)


def test_shorthands():
    config = parse_run_config(
        base(
            search_space={
                "parameters": {
                    "model": ["a", "b"],
                    "style": {"choices": ["x", "y"]},
                    "k": {"type": "int", "min": 1, "max": 8},
                    "lr": {"type": "float", "min": 1e-5, "max": 1e-1, "scale": "log"},
                    "stream": {"type": "bool"},
                }
            },
            optimization={"evolution": {"population": 8, "mutation": 0.5, "crossover": 0.5, "elite": 1}},
        )
    )
    params = {p.name: p for p in config.search_space.to_space().params}
    assert params["model"].values == ("a", "b") and params["style"].kind == CATEGORICAL
    assert params["k"].integer and params["k"].step == 1
    assert params["lr"].log
    assert params["stream"].values == (True, False)
    evo = config.optimization.evolution
    assert (evo.population_size, evo.mutation_rate, evo.crossover_rate, evo.elite_size) == (8, 0.5, 0.5, 1)


def test_min_above_max_names_the_parameter():
    found = problems(base(search_space={"parameters": {"temperature": {"type": "float", "min": 1.5, "max": 0.1}}}))
    assert found == ["search_space.parameters.temperature: min must be less than max (min=1.5, max=0.1)"]


def test_bad_types_name_the_field():
    found = problems(
        base(
            search_space={"parameters": {"temperature": {"type": "float", "min": "low", "max": 1.0}}},
            optimization={"evolution": {"population_size": "many"}},
        )
    )
    assert any(p.startswith("search_space.parameters.temperature.min:") and "'low'" in p for p in found), found
    assert any(p.startswith("optimization.evolution.population_size:") and "'many'" in p for p in found), found


def test_unknown_metric_type_lists_the_valid_ones():
    data = base()
    data["evaluation"]["metrics"] = {"quality": {"type": "bleu", "weight": 1.0}}
    (found,) = problems(data)
    assert found.startswith("evaluation.metrics.quality: unknown metric type 'bleu'")
    assert "llm_judge" in found and "exact_match" in found


def test_required_metric_that_is_not_defined():
    data = base()
    data["evaluation"]["required_metrics"] = ["quality", "toxicity"]
    (found,) = problems(data)
    assert "toxicity" in found and found.startswith("evaluation:")


@pytest.mark.parametrize(
    ("param", "expected"),
    [
        ({"type": "float", "min": 0.0, "max": 1.0, "log": True}, "a log scale needs min > 0"),
        ({"type": "float", "min": 0.0, "max": 1.0, "step": 2.0}, "step 2.0 is larger than the range"),
        ({"type": "float", "min": 0.0}, "needs both min and max"),
        ({"type": "categorical", "values": []}, "non-empty list of values"),
        ({"type": "discrete", "values": ["a", 1]}, "discrete values must be numbers"),
        ({"type": "gaussian", "min": 0, "max": 1}, "unknown parameter type 'gaussian'"),
    ],
)
def test_parameter_errors(param, expected):
    (found,) = problems(base(search_space={"parameters": {"p": param}}))
    assert found.startswith("search_space.parameters.p") and expected in found, found


def test_typos_and_structure():
    data = base(optimisation={"algorithm": "genetic"})
    assert problems(data) == ["optimisation: unknown field (check the spelling)"]
    # The Convergence ran an elite_size at or above the population; it is lowered, with a warning
    config = parse_run_config(base(optimization={"evolution": {"population_size": 4, "elite_size": 4}}))
    assert config.optimization.search_settings().elite_size == 3
    assert any(
        w.startswith("optimization.evolution.elite_size: 4 is not below population_size 4") for w in config.warnings()
    )
    # ...and its default (2) never refuses a population of 2 or 1
    for population, elite in ((2, 1), (1, 0)):
        config = parse_run_config(base(optimization={"evolution": {"population_size": population}}))
        assert config.optimization.search_settings().elite_size == elite
        assert not any("elite_size" in w for w in config.warnings())
    data = base()
    del data["api"]
    assert problems(data) == ["api: required field is missing"]


def test_test_cases_from_files(tmp_path):
    (tmp_path / "cases.jsonl").write_text('{"id": "a", "input": "x"}\n{"input": "y"}\n')
    (tmp_path / "dupes.json").write_text(json.dumps([{"id": "a", "input": 1}, {"id": "a", "input": 2}]))
    for name, body in (("ok.yaml", "cases.jsonl"), ("dupes.yaml", "dupes.json"), ("missing.yaml", "nope.json")):
        data = base()
        data["evaluation"]["test_cases"] = {"path": body}
        (tmp_path / name).write_text(yaml.safe_dump(data))
    cases = load_run_config(tmp_path / "ok.yaml").test_cases(tmp_path)
    assert [c.id for c in cases] == ["a", "case-2"]
    with pytest.raises(RunConfigError, match=r"duplicate ids \['a'\]"):
        load_run_config(tmp_path / "dupes.yaml")
    with pytest.raises(RunConfigError, match="file not found"):
        load_run_config(tmp_path / "missing.yaml")


def test_racing_incumbent_and_revisit_reach_the_search_settings():
    default = parse_run_config(base()).optimization.search_settings()
    assert (default.racing_incumbent, default.racing_incumbent_confidence, default.racing_revisit) == (False, None, 0)
    racing = {"incumbent": True, "incumbent_confidence": 0.95, "revisit": 2}
    settings = parse_run_config(base(optimization={"racing": racing})).optimization.search_settings()
    assert (settings.racing_incumbent, settings.racing_incumbent_confidence, settings.racing_revisit) == (True, 0.95, 2)
    found = problems(base(optimization={"racing": {"incumbent_confidence": 1.5, "revisit": -1}}))
    assert any(p.startswith("optimization.racing.incumbent_confidence:") for p in found), found
    assert any(p.startswith("optimization.racing.revisit:") for p in found), found


def test_racing_sequential_and_margin_reach_the_search_settings():
    default = parse_run_config(base()).optimization.search_settings()
    assert (default.racing_sequential, default.racing_margin) == ("none", 0.0)
    racing = {"sequential": "spending", "margin": 0.02}
    settings = parse_run_config(base(optimization={"racing": racing})).optimization.search_settings()
    assert (settings.racing_sequential, settings.racing_margin) == ("spending", 0.02)
    found = problems(base(optimization={"racing": {"sequential": "pocock", "margin": -1}}))
    assert any(p.startswith("optimization.racing.sequential:") for p in found), found
    assert any(p.startswith("optimization.racing.margin:") for p in found), found
