"""RLP's information gain against the real local model server (SmolLM2-135M-Instruct when
installed): a thought that states the outcome verbatim gains more than an unrelated one, and
each log-likelihood equals a direct transformers computation over the same weights (the
outcome's tokens found there by the tokenizer's own offsets, not the server's)."""

from __future__ import annotations

import math

import httpx
import pytest

from flywheel.society.rlp import LogprobScorer, information_gain, render_outcome
from flywheel.society.rlp.information_gain import with_thought_prefix, without_thought_prefix

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CONTEXT = (
    "An optimizer tunes the sampling temperature of a chat model; higher score is better.\n"
    "History:\n- temperature 0.2: score 0.410\n- temperature 0.9: score 0.550"
)
OUTCOME = render_outcome({"temperature 0.7": 0.85, "temperature 0.5": 0.62})
VERBATIM = "I predict exactly this:\n" + OUTCOME.strip()
UNRELATED = "Bananas are yellow and grow in warm tropical places near the sea."


def direct_logprob(base, prefix: str, outcome: str) -> float:
    """log p(outcome | prefix) with transformers: the outcome's tokens are those of the whole
    text that start at or after the prefix's end (tokenising the prefix alone would not do:
    it ends in a "\n\n" token that the whole text splits in two)."""
    import torch

    enc = base.tokenizer(prefix + outcome, return_offsets_mapping=True)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    first = next(i for i, (start, _) in enumerate(spans) if start >= len(prefix))
    assert spans[first - 1][1] <= len(prefix)  # no token spans the boundary
    with torch.inference_mode():
        logits = base.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return float(logp[first - 1 :].sum())


@pytest.fixture
def served_model(model_server) -> str:
    headers = {"Authorization": f"Bearer {model_server.api_key}"}
    return httpx.get(f"{model_server.url}/models", headers=headers, timeout=10).json()["data"][0]["id"]


async def test_a_verbatim_thought_gains_more_than_an_unrelated_one(model_server, served_model: str) -> None:
    model = served_model
    async with LogprobScorer(model_server.url, model_server.api_key) as scorer:
        verbatim = await information_gain(
            scorer, model=model, baseline_model=model, context=CONTEXT, thought=VERBATIM, outcome=OUTCOME
        )
        unrelated = await information_gain(
            scorer, model=model, baseline_model=model, context=CONTEXT, thought=UNRELATED, outcome=OUTCOME
        )
    for gain in (verbatim, unrelated):
        assert gain.definition == "logprob_information_gain" and math.isfinite(gain.reward)
        assert gain.outcome_tokens > 10 and gain.notes == []
    assert verbatim.without_thought == pytest.approx(unrelated.without_thought, abs=1e-5)  # one baseline
    print(f"\n{model}: gain verbatim {verbatim.reward:.3f}, unrelated {unrelated.reward:.3f} nats")

    from flywheel.modelserver.loading import load_base

    spec = "smollm2" if model.startswith("smollm2") else "tiny"
    base = load_base(spec, device="cpu")
    assert base.name == model
    assert verbatim.with_thought == pytest.approx(
        direct_logprob(base, with_thought_prefix(CONTEXT, VERBATIM), OUTCOME), abs=1e-3
    )
    assert verbatim.without_thought == pytest.approx(
        direct_logprob(base, without_thought_prefix(CONTEXT), OUTCOME), abs=1e-3
    )
    if spec == "smollm2":  # a tiny random model has no reason to copy its context
        assert verbatim.reward > unrelated.reward + 1.0
