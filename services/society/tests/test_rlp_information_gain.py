"""Information gain from echoed log-probabilities (against a scripted /v1/completions), the
outcome's tokens found by text offsets, providers without log-probabilities, and the
fallback that scores stated predictions."""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest

from flywheel.society.rlp import (
    LogprobScorer,
    LogprobsUnavailable,
    ScoringError,
    information_gain,
    prediction_gain,
    render_outcome,
)
from flywheel.society.rlp.information_gain import outcome_slice, with_thought_prefix, without_thought_prefix

TOKEN = re.compile(r"\n| ?[^\s]+")
OUTCOME = render_outcome({"cfg-a": 0.85, "cfg-b": 0.4})


def echo_server(logprob_of: dict[str, float], seen: list[dict]):
    """A scripted completions endpoint: splits the prompt into newlines and words (each with its
    leading space), gives each the log-probability ``logprob_of`` names (else -1; the first
    none), 0.5 less for the model "base"."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        text = body["prompt"]
        tokens = TOKEN.findall(text)
        assert "".join(tokens) == text
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        bonus = -0.5 if body["model"] == "base" else 0.0
        values = [None] + [logprob_of.get(t, -1.0) + bonus for t in tokens[1:]]
        lp = {"tokens": tokens, "token_logprobs": values, "text_offset": offsets, "top_logprobs": None}
        return httpx.Response(200, json={"choices": [{"text": text, "logprobs": lp, "index": 0}]})

    return handler


async def test_gain_sums_only_the_outcome_tokens() -> None:
    seen: list[dict] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(echo_server({" 0.850": -0.1}, seen)))
    scorer = LogprobScorer("http://model/v1", "key", client=client)
    context, thought = "History: a=0.8", "expect 0.85"
    gain = await information_gain(
        scorer, model="reasoner", baseline_model="base", context=context, thought=thought, outcome=OUTCOME
    )
    assert [b["prompt"] for b in seen] == [
        with_thought_prefix("History: a=0.8", "expect 0.85") + OUTCOME,
        without_thought_prefix("History: a=0.8") + OUTCOME,
    ]
    assert all(b["echo"] is True and b["max_tokens"] == 0 and b["logprobs"] == 0 for b in seen)
    n = gain.outcome_tokens
    assert n == len(TOKEN.findall(OUTCOME)) == 13
    # with thought: n tokens at -1 except " 0.850" at -0.1; baseline the same, each 0.5 lower
    assert gain.with_thought == pytest.approx(-(n - 1) - 0.1)
    assert gain.without_thought == pytest.approx(-(n - 1) - 0.1 - 0.5 * n)
    assert gain.reward == pytest.approx(0.5 * n)
    assert gain.definition == "logprob_information_gain" and "adapter-free base model 'base'" in gain.baseline
    assert gain.notes == []
    await client.aclose()


def test_a_token_straddling_the_boundary_is_counted_and_flagged() -> None:
    lp = {"tokens": ["ab", "c", "de", "f"], "token_logprobs": [None, -1.0, -2.0, -3.0], "text_offset": [0, 2, 3, 5]}
    clean = outcome_slice(lp, 3)
    assert (clean.logprob, clean.tokens, clean.straddled) == (-5.0, ["de", "f"], False)
    cut = outcome_slice(lp, 4)  # "de" spans offset 4
    assert (cut.logprob, cut.tokens, cut.straddled) == (-5.0, ["de", "f"], True)
    with pytest.raises(ScoringError, match="no finite log-probability"):
        outcome_slice(lp, 0)
    with pytest.raises(ScoringError, match="no token of the outcome"):
        outcome_slice(lp, 6)
    with pytest.raises(LogprobsUnavailable):
        outcome_slice(None, 3)


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (404, {"error": {"message": "Not Found"}}, LogprobsUnavailable),
        (400, {"error": {"message": "logprobs are not supported"}}, LogprobsUnavailable),
        (400, {"error": {"message": "the prompt is 9000 tokens"}}, ScoringError),
        (500, {"error": {"message": "boom"}}, ScoringError),
        (200, {"choices": [{"text": "x", "logprobs": None}]}, LogprobsUnavailable),
        (200, {"unexpected": True}, ScoringError),
    ],
)
async def test_answers_without_logprobs(status: int, body: dict, error: type) -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(status, json=body)))
    with pytest.raises(error) as caught:
        await LogprobScorer("http://model/v1", client=client).outcome_logprob("m", "ctx\n\n", OUTCOME)
    if status != 200:
        assert str(status) in str(caught.value)
    await client.aclose()


async def test_timeouts_and_empty_inputs_are_scoring_errors() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(slow))
    scorer = LogprobScorer("http://model/v1", client=client)
    with pytest.raises(ScoringError, match="no answer in time"):
        await scorer.outcome_logprob("m", "ctx\n\n", OUTCOME)
    with pytest.raises(ScoringError, match="thought"):
        await information_gain(scorer, model="m", baseline_model="m", context="c", thought=" ", outcome=OUTCOME)
    with pytest.raises(ScoringError, match="outcome"):
        render_outcome({})
    with pytest.raises(ScoringError, match="not finite"):
        render_outcome({"a": math.nan})
    await client.aclose()


def test_prediction_fallback_is_a_gaussian_log_likelihood_gain() -> None:
    observed = {"a": 0.8, "b": 0.3, "c": 0.5}
    predicted = {"a": 0.75, "b": 0.6, "z": 0.9}

    def ll(y: float, mu: float, s: float) -> float:
        return -0.5 * math.log(2 * math.pi * s * s) - (y - mu) ** 2 / (2 * s * s)

    plain = prediction_gain(predicted, observed, sigmas={"a": 0.05}, default_sigma=0.2)
    assert plain.definition == "prediction_log_likelihood"
    assert plain.reward == pytest.approx(ll(0.8, 0.75, 0.05) + ll(0.3, 0.6, 0.2))
    assert any("not observed" in n for n in plain.notes)

    gain = prediction_gain(predicted, observed, sigmas={"a": 0.05}, default_sigma=0.2, baseline_mean=0.5)
    assert gain.definition == "prediction_information_gain" and "N(0.500, 0.200)" in gain.baseline
    assert gain.reward == pytest.approx(plain.reward - ll(0.8, 0.5, 0.2) - ll(0.3, 0.5, 0.2))

    # A sharper correct prediction earns more than a vague one; a confident wrong one less.
    sharp = prediction_gain({"a": 0.8}, observed, sigmas={"a": 0.02}, baseline_mean=0.5)
    vague = prediction_gain({"a": 0.8}, observed, sigmas={"a": 0.3}, baseline_mean=0.5)
    wrong = prediction_gain({"a": 0.2}, observed, sigmas={"a": 0.02}, baseline_mean=0.5)
    assert sharp.reward > vague.reward > wrong.reward
    with pytest.raises(ScoringError, match="no observed config was predicted"):
        prediction_gain({"z": 1.0}, observed)


async def test_thought_reward_uses_logprobs_and_falls_back_naming_why() -> None:
    from flywheel.society.rlp import ProposedConfig, RLPConfig, Thought, thought_reward

    thought = Thought("a is good", [ProposedConfig({"a": 1}, 0.8, 0.05)])
    key = thought.proposals[0].key
    observed = {key: 0.78}
    seen: list[dict] = []
    good = httpx.AsyncClient(transport=httpx.MockTransport(echo_server({}, seen)))
    config = RLPConfig(model_name="reasoner", base_model_name="base")
    gain = await thought_reward(
        config, context="ctx", thought=thought, observed=observed, scorer=LogprobScorer("http://m/v1", client=good)
    )
    assert gain.definition == "logprob_information_gain" and [b["model"] for b in seen] == ["reasoner", "base"]
    assert render_outcome(observed) in seen[0]["prompt"]

    missing = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(404, json={})))
    fallback = await thought_reward(
        config,
        context="ctx",
        thought=thought,
        observed=observed,
        scorer=LogprobScorer("http://m/v1", client=missing),
        baseline_mean=0.5,
    )
    assert fallback.definition == "prediction_information_gain" and "404" in fallback.notes[0]
    assert fallback.reward > 0  # 0.8 +- 0.05 explains 0.78 better than 0.5 +- 0.1
    off = await thought_reward(
        RLPConfig(use_logprobs=False), context="ctx", thought=thought, observed=observed, scorer=None
    )
    assert off.definition == "prediction_log_likelihood" and "use_logprobs is off" in off.notes[0]
    with pytest.raises(ScoringError, match="no observed config"):
        await thought_reward(config, context="ctx", thought=thought, observed={"other": 0.1}, scorer=None)
    await good.aclose()
    await missing.aclose()
