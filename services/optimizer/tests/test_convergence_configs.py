"""Every config The Convergence 0.1.8 accepts is accepted here: the 7 examples its PyPI package
ships and the 4 its template generator writes (copies in convergence_configs/, made by
scripts/convergence_configs.py). What Flywheel reads and acts on is checked on the requests
it builds; what it cannot act on is a warning naming the field. Running them end to end
against a stand-in target: tests/integration/test_run_outcomes.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flywheel.api.evaluator.v1 import events_pb2 as ev
from flywheel.optimizer.runconfig import RunConfigError, load_run_config, parse_run_config
from flywheel.optimizer.runs.requests import RequestTemplate
from flywheel.optimizer.runs.service import evaluator_refusals
from flywheel.sdk.runs import load_run_file

HERE = Path(__file__).parent / "convergence_configs"
CONFIGS = sorted(HERE.rglob("*.yaml"))
NAMES = [str(p.parent.relative_to(HERE)) for p in CONFIGS]


def test_the_test_set_is_complete():
    assert len([n for n in NAMES if n.startswith("examples/")]) == 7
    assert len([n for n in NAMES if n.startswith("templates/")]) == 4


@pytest.mark.parametrize("path", CONFIGS, ids=NAMES)
def test_each_config_is_accepted_and_lists_its_warnings(path: Path):
    config = load_run_config(path)  # with its test cases, relative to the file
    cases = config.test_cases(path.parent)
    assert cases
    warnings = config.warnings()
    print(f"{path.parent.name}: {len(warnings)} warning(s)", *warnings, sep="\n  ")
    assert all(": " in w and w.split(": ")[0].split(".")[0] in _TOP for w in warnings), warnings
    raw = path.read_text()
    if "adapter_enabled: true" in raw:
        assert any(w.startswith("api.adapter_enabled:") for w in warnings)
    # the same config as `flywheel optimize` sends it (test cases inlined) builds requests
    data = load_run_file(path)
    parsed = parse_run_config(data)
    template = RequestTemplate.of("run-x", parsed)
    candidate = parsed.search_space.to_space().sample(np.random.default_rng(0))
    request = template.build("c1", candidate, next(iter(template.cases)))
    if parsed.api.kind == "http":
        assert request.target.http.url.startswith("https://"), request.target.http.url
    customs = [m for m in request.metrics if m.type == ev.METRIC_TYPE_CUSTOM]
    if parsed.evaluation.custom_evaluator is not None and parsed.evaluation.custom_evaluator.enabled:
        assert customs and all(m.method == "convergence" and m.callable for m in customs)
    else:  # only the web_automation template: custom metrics and no scorer, refused at StartRun
        assert evaluator_refusals(parsed) == [
            f"evaluation.metrics.{m.name}: a custom metric needs a scorer: callable 'package.module:function', or "
            "evaluation.custom_evaluator (module, function) for The Convergence's function: custom metrics"
            for m in customs
        ]


_TOP = {"api", "society", "agent", "legacy", "output", "optimization", "rate_limiting", "evaluation", "search_space"}


def load(name: str):
    (path,) = [p for p in CONFIGS if p.parent.name == name]
    return parse_run_config(load_run_file(path))


def test_descriptive_test_case_fields_are_kept_as_metadata():
    cases = load("agno_gmail").test_cases()
    assert cases[0].metadata["function"] == "get_unread_emails"
    assert cases[0].metadata["description"] == "Simple unread email check"
    assert load("agno_discord").evaluation.metrics["accuracy"].description.startswith("Tool usage correctness")
    # BrowserBase's cases put url, selector... at the top level: they are the input
    assert "url" in load("browserbase").test_cases()[0].input


def test_azure_models_pick_the_url_per_candidate():
    config = load("azure_multi_model")
    template = RequestTemplate.of("run-a", config)
    case = next(iter(template.cases))
    for model, deployment in (("gpt-4.1", "/deployments/gpt-4/"), ("o4-mini", "/deployments/o4-mini/")):
        request = template.build("c", {"model": model, "temperature": 0.2, "max_completion_tokens": 500}, case)
        assert deployment in request.target.http.url
        assert request.target.http.header_envs["api-key"] == "AZURE_API_KEY"
    bad = load_run_file(next(p for p in CONFIGS if p.parent.name == "azure_multi_model"))
    bad["search_space"]["parameters"]["model"]["values"].append("gpt-5")
    with pytest.raises(RunConfigError, match=r"search_space.parameters.model: \['gpt-5'\] not in api.models"):
        parse_run_config(bad)


def test_groq_result_field_timeout_and_custom_evaluator_are_honoured():
    config = load("groq")
    template = RequestTemplate.of("run-g", config)
    assert template.target.http.response_path == "choices[0].message.content"
    assert template.target.http.header_envs["Authorization"] == "Bearer ${GROQ_API_KEY}"
    assert template.timeout_s == 30.0  # api.request.timeout_seconds
    metrics = {m.name: m for m in template.metrics}
    assert metrics["response_quality"].callable == "groq_responses:score_groq_response"
    assert metrics["response_quality"].method == "convergence"
    assert metrics["latency_ms"].type == ev.METRIC_TYPE_LATENCY and metrics["latency_ms"].target == 2000


def test_population_one_evolution_and_rate_limits():
    discord = load("agno_discord")
    settings = discord.optimization.search_settings()
    assert (settings.population_size, settings.elite_size, settings.algorithm) == (1, 0, "genetic")
    assert any(
        w.startswith("optimization.evolution.elite_size: 2 is not below population_size 1") for w in discord.warnings()
    )
    assert load("agno_gmail").request_interval_s() == pytest.approx(1.2)  # 50 requests per minute
    # max_retries (The Convergence counted every attempt) and retry_delay_seconds go with each request
    reddit = RequestTemplate.of("run-r", load("agno_reddit"))
    request = reddit.build("c", {"model": "gpt-4.1"}, next(iter(reddit.cases)))
    assert (request.max_attempts, request.retry_backoff_s) == (3, 2.0)
    groq = RequestTemplate.of("run-g", load("groq"))
    assert (groq.max_attempts, groq.retry_backoff_s) == (5, 0.0)  # 0: the evaluator's default delay

    # population 2 with the default elite_size (2) is not refused
    two = load_run_file(next(p for p in CONFIGS if p.parent.name == "llm_chat_openai"))
    two["optimization"]["evolution"] = {"population_size": 2}
    assert parse_run_config(two).optimization.search_settings().elite_size == 1


def test_an_enabled_society_says_where_its_proposals_come_from():
    for name in ("openai", "azure_multi_model", "browserbase"):  # rlp_enabled and sao_enabled
        said = [w for w in load(name).warnings() if w.startswith("society")]
        assert len(said) == 1
        assert said[0].startswith("society.enabled: the society service does RLP and SAO for this run")
        assert "not started" not in said[0] and "does nothing" not in said[0]
    assert not any(w.startswith("society") for w in load("groq").warnings())  # society.enabled: false

    only_rlp = load_run_file(next(p for p in CONFIGS if p.parent.name == "openai"))
    only_rlp["society"]["learning"] = {"rlp_enabled": True, "sao_enabled": False}
    said = [w for w in parse_run_config(only_rlp).warnings() if w.startswith("society")]
    assert said[0].startswith("society.enabled: the society service does RLP for this run")
    # enabled with nothing to learn: the society has nothing to do for this run
    only_rlp["society"]["learning"] = {}
    said = [w for w in parse_run_config(only_rlp).warnings() if w.startswith("society")]
    assert said == [
        "society.enabled: neither society.learning.rlp_enabled nor society.learning.sao_enabled is set; "
        "the society does nothing for this run"
    ]


def test_bad_test_cases_are_all_listed_with_their_path_not_pydantic_text(tmp_path: Path):
    (tmp_path / "cases.json").write_text('[{"id": "a", "inptu": "x"}, {"id": "b", "input": "y", "expectd": 1}]')
    (tmp_path / "c.yaml").write_text(
        "api: {name: t, endpoint: 'http://127.0.0.1:1/'}\n"
        "search_space: {parameters: {t: [1, 2]}}\n"
        "evaluation: {test_cases: {path: cases.json}, metrics: {q: {type: exact_match}}}\n"
    )
    with pytest.raises(RunConfigError) as info:
        load_run_config(tmp_path / "c.yaml")
    assert info.value.problems == [
        "evaluation.test_cases (cases.json)[0].input: required field is missing",
        "evaluation.test_cases (cases.json)[0].inptu: unknown field (check the spelling)",
        "evaluation.test_cases (cases.json)[1].expectd: unknown field (check the spelling)",
    ]
    assert "pydantic" not in str(info.value) and "validation error" not in str(info.value)
