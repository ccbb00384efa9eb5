"""An SAO round on the local model server: the policy model is the real local model server
(SmolLM2-135M-Instruct when installed, else a tiny random model) through LiteLLM, the reward
judge the real process (its LLM scripted, see sao_stubs). The model's text may be anything, so
the test checks the plumbing: every prompt is accounted for, kept or dropped with a reason (a
garbage ranking is ``unparsable_ranking``).

The scripted round with exact counts, S3 publication and the trainer's DPO dry run runs through
the society service itself in test_society_service."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from flywheel.core.judge_client import JudgeClient
from flywheel.core.llm import LlmSettings, load_litellm
from flywheel.society.sao import LiteLlm, SaoConfig, run_round

from .sao_stubs import judge_llm, start_judge  # noqa: F401 - judge_llm is a fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_sao_round_on_the_local_model_server(launch, judge_llm, model_server):  # noqa: F811
    await load_litellm()
    judge_process = start_judge(launch, judge_llm)
    headers = {"Authorization": f"Bearer {model_server.api_key}"}
    async with httpx.AsyncClient(timeout=10) as http:
        served = (await http.get(f"{model_server.url}/models", headers=headers)).json()["data"][0]["id"]
    llm = LiteLlm.from_settings(
        LlmSettings(
            model=f"openai/{served}",
            api_base=model_server.url,
            api_key=SecretStr(model_server.api_key),
            timeout_s=100,
            max_retries=0,
        )
    )
    # Small: on a loaded 2-core CPU the 135M model writes a few tokens a second.
    config = SaoConfig(
        n_personas=2, batch_size=4, min_response_length=1, max_persona_tokens=16, max_prompt_tokens=16,
        max_response_tokens=16, max_ranking_tokens=16, llm_timeout_s=120,
    )  # fmt: skip
    judge = JudgeClient(judge_process.address, timeout_s=30)
    try:
        result = await run_round(config, llm=llm, judge=judge)
    finally:
        await judge.close()
    s = result.stats
    assert s.personas == 2 and s.prompts_generated + s.dropped.get("prompt_llm_empty", 0) == 2
    # Every prompt is kept or dropped with a reason; a garbage ranking is a counted drop.
    assert s.kept + s.dropped_total == s.attempted == 2, s.to_dict()
    assert set(s.dropped) <= {
        "prompt_llm_empty", "response_llm_empty", "duplicate_prompt", "identical_responses", "too_short",
        "unparsable_ranking", "ranking_llm_empty", "judge_tie", "judge_order_disagreement", "self_judge_disagreement",
    }, s.dropped  # fmt: skip
    assert s.self_ranked <= s.pairs_generated <= 2
    for r in result.records:
        assert r.chosen != r.rejected and r.iteration == 1
