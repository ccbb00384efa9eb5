"""The RLP loop with a scripted reasoning model and optimizer, on the session's real
PostgreSQL: failed steps (prose, nothing, a timeout, a provider error) send no proposal; a
step is made once however often its progress event arrives; resolution rewards each thought
(hit vs the generation median, group advantage, normaliser persisted, GAE); the buffer is
capped; a bad society block is one failed step; the stats add up."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from google.protobuf import json_format
from sqlalchemy import select

import flywheel.society
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.society.v1.events_pb2 import PROPOSAL_SOURCE_RLP
from flywheel.core.db import create_engine, session_factory
from flywheel.core.migrations import upgrade
from flywheel.core.settings import DatabaseSettings
from flywheel.society.models import RlpExperienceRow, RlpPolicyRow, RlpProposalRow, RlpStepRow
from flywheel.society.rlp import buffer
from flywheel.society.rlp.information_gain import OutcomeScore, ScoringError
from flywheel.society.rlp.schema import thoughts_response_format
from flywheel.society.rlp.stats import rlp_stats

from .rlp_fakes import (
    GOOD,
    SPACE,
    FakePublisher,
    FakeRuns,
    FakeThinker,
    answer,
    delivery,
    make_service,
    progress,
    run_config,
)

pytestmark = [pytest.mark.timeout(120)]
RUN = "run-a"


@pytest.fixture
def society_env(servers, isolation, monkeypatch) -> dict[str, str]:
    """The stack's variables in the environment and the society's tables migrated."""
    env = servers.env(**isolation)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    upgrade(
        DatabaseSettings(), script_location=Path(flywheel.society.__file__).parent / "migrations", service="society"
    )
    return env


@pytest.fixture
async def sessions(society_env):
    engine = create_engine(DatabaseSettings())
    yield session_factory(engine)
    await engine.dispose()


async def rows(sessions, model):
    async with sessions() as s:
        return list((await s.scalars(select(model))).all())


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("I think a temperature of 0.7 would be best, and 512 tokens.", "no_prediction"),
        ("", "llm_empty"),
        ("sleep", "llm_timeout"),
        (RuntimeError("provider answered 500"), "llm_error"),
        (
            RuntimeError("BadRequestError: response_format is not supported by this model"),
            "llm_rejected_response_format",
        ),
        (answer(("only one thought", [(0.5, 128, 0.5)])), "no_prediction"),
    ],
)
async def test_a_failed_step_has_its_reason_and_sends_no_proposal(sessions, script, reason) -> None:
    runs = FakeRuns(run_config())
    runs.add(0, {"t": 0.5, "n": 256}, 0.4)
    publisher = FakePublisher()
    service = make_service(sessions, runs, FakeThinker(script), publisher=publisher, step_timeout_s=0.3)
    await service.on_progress(progress(RUN, 0), delivery())  # returns (acks): the run goes on
    (step,) = await rows(sessions, RlpStepRow)
    assert (step.state, step.reason) == ("failed", reason)
    assert step.detail or reason == "llm_empty"
    assert publisher.sent == [] and await rows(sessions, RlpProposalRow) == []
    # The same generation again (a redelivery) does not retry the failed step.
    await service.on_progress(progress(RUN, 0), delivery(2))
    assert len(await rows(sessions, RlpStepRow)) == 1
    async with sessions() as s:
        stats = await rlp_stats(s, RUN)
    assert (stats.steps, stats.steps_failed, dict(stats.failures)) == (1, 1, {reason: 1})


async def test_one_step_per_generation_and_proposals_published_once(sessions) -> None:
    runs = FakeRuns(run_config(proposals_per_generation=2))
    runs.add(0, {"t": 0.5, "n": 256}, 0.4)
    runs.add(0, {"t": 0.9, "n": 512}, 0.7)  # already in the run: not proposed again
    think = FakeThinker(
        answer(
            ("warm", [(0.9, 512, 0.9), (0.8, 512, 0.85)]),
            ("cold", [(0.1, 256, 0.6), (0.23, 128, 0.5)]),
        )
    )
    publisher = FakePublisher()
    service = make_service(sessions, runs, think, publisher=publisher)
    # Two deliveries of the same generation at once, and a second replica.
    other = make_service(sessions, runs, think, publisher=publisher)
    await asyncio.gather(
        service.on_progress(progress(RUN, 0), delivery()),
        service.on_progress(progress(RUN, 0), delivery()),
        other.on_progress(progress(RUN, 0), delivery()),
    )
    assert len(think.calls) == 1
    (step,) = await rows(sessions, RlpStepRow)
    assert step.state == "proposed" and len(step.thoughts) == 2 and step.context.startswith("<|system|>")
    assert len(publisher.sent) == 2
    configs = [json_format.MessageToDict(e.config) for _, e, _ in publisher.sent]
    # The two best-predicted new ones (0.9/512 is in the run already), snapped onto the space.
    assert configs == [{"t": 0.8, "n": 512.0}, {"t": 0.1, "n": 256.0}]
    subject, event, msg_id = publisher.sent[0]
    assert subject == "tns.society.proposal.run-a" and event.source == PROPOSAL_SOURCE_RLP
    assert event.meta.event_id == msg_id and event.run_id == RUN and event.rationale == "warm"
    assert math.isfinite(event.expected_information_gain) and event.expected_information_gain >= 0
    # A redelivery republishes the same event ids (JetStream and the optimizer drop them).
    await service.on_progress(progress(RUN, 0), delivery(2))
    assert [m for *_, m in publisher.sent[2:]] == [m for *_, m in publisher.sent[:2]]
    assert len(await rows(sessions, RlpStepRow)) == 1 and len(await rows(sessions, RlpProposalRow)) == 2
    assert think.calls[0]["temperature"] == 0.7 and think.calls[0]["max"] == 500
    # The thoughts' schema goes with the request (FLYWHEEL_SOCIETY_RLP_STRUCTURED_OUTPUT, default on).
    fmt = think.calls[0]["response_format"]
    assert fmt == thoughts_response_format(
        SPACE["parameters"], n_thoughts=2, proposals_per_thought=2, thought_length=500, scores=[0.4, 0.7]
    )
    assert runs.config_calls == 2  # the run config is fetched once per run by each replica


async def test_structured_output_can_be_turned_off(sessions) -> None:
    runs = FakeRuns(run_config())
    think = FakeThinker(GOOD)
    service = make_service(sessions, runs, think, rlp_structured_output=False)
    await service.on_progress(progress(RUN, 0), delivery())
    assert think.calls[0]["response_format"] is None
    (step,) = await rows(sessions, RlpStepRow)
    assert step.state == "proposed"


class FakeScorer:
    """log p(outcome | prefix): higher when the prefix mentions "warm" (a thought that helps)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.models: set[str] = set()

    async def outcome_logprob(self, model: str, prefix: str, outcome: str) -> OutcomeScore:
        if self.fail:
            raise ScoringError("model server answered 500")
        self.models.add(model)
        value = -10.0 + (3.0 if "Thought: warm" in prefix else 1.0 if "Thought:" in prefix else 0.0)
        return OutcomeScore(value, ["x"], [value], False)


async def test_resolution_rewards_each_thought_with_advantages_and_a_persisted_normaliser(sessions) -> None:
    runs = FakeRuns(run_config(num_thoughts=3, proposals_per_generation=2))
    for t, score in ((0.2, 0.3), (0.4, 0.5)):
        runs.add(0, {"t": t, "n": 128}, score)
    scorer = FakeScorer()
    think = FakeThinker(
        answer(
            ("warm is better", [(0.9, 512, 0.8)]),
            ("cold is better", [(0.1, 256, 0.6)]),
            ("never run", [(0.5, 128, 0.4)]),
        ),
        answer(("warm again", [(0.8, 512, 0.8)]), ("cold again", [(0.2, 256, 0.6)])),
    )
    service = make_service(sessions, runs, think, scorer=scorer)
    await service.on_progress(progress(RUN, 0), delivery())
    sent = await rows(sessions, RlpProposalRow)
    assert len(sent) == 2  # the run sets proposals_per_generation: 2
    # The run races them in generation 0 (numbers come back as doubles), then moves on.
    runs.add(0, {"t": 0.9, "n": 512}, 0.9, origin="rlp")
    runs.add(0, {"t": 0.1, "n": 256}, 0.35, origin="rlp")
    runs.generation = 1
    await service.on_progress(progress(RUN, 1), delivery())
    steps = {s.generation: s for s in await rows(sessions, RlpStepRow)}
    assert steps[0].state == "rewarded" and "1 thought(s) without an evaluated config" in steps[0].detail
    assert steps[1].state == "proposed"  # the next generation's step was made after the resolution
    by_config = {p.config_key: p for p in await rows(sessions, RlpProposalRow) if p.generation == 0}
    median = 0.425  # of 0.3, 0.5, 0.9, 0.35
    warm, cold = by_config['{"n":512,"t":0.9}'], by_config['{"n":256,"t":0.1}']
    assert (warm.observed_score, warm.generation_median, warm.hit) == (0.9, pytest.approx(median), True)
    assert (cold.observed_score, cold.hit) == (0.35, False)
    exps = sorted(await rows(sessions, RlpExperienceRow), key=lambda e: e.thought_index)
    assert [e.thought_index for e in exps] == [0, 1]  # "never run" gets no experience
    assert [e.reward for e in exps] == [pytest.approx(3.0), pytest.approx(1.0)]
    assert all(e.definition == "logprob_information_gain" for e in exps)
    # A = G/(G-1) (r - mean r) with G = 2: +-2
    assert [e.advantage for e in exps] == [pytest.approx(2.0), pytest.approx(-2.0)]
    assert "Observed outcome:" in exps[0].outcome and exps[0].context == steps[0].context
    (policy,) = await rows(sessions, RlpPolicyRow)
    assert policy.normalizer["count"] == 2 and policy.normalizer["mean"] == pytest.approx(2.0)
    std = math.sqrt(2.0)  # sample std of (3, 1)
    assert [e.normalized_reward for e in exps] == [pytest.approx(1 / std), pytest.approx(-1 / std)]
    # GAE of the only step (mean normalised 0) plus each thought's deviation.
    assert [e.gae_advantage for e in exps] == [pytest.approx(1 / std), pytest.approx(-1 / std)]
    assert scorer.models == {"local"}  # FLYWHEEL_LLM_MODEL openai/local, served as "local"

    # Generation 1's thoughts are rewarded when the run finishes; the normaliser goes on
    # from its persisted state, and GAE now runs over both generations.
    runs.add(1, {"t": 0.8, "n": 512}, 0.8, origin="rlp")
    runs.add(1, {"t": 0.2, "n": 256}, 0.4, origin="rlp")
    fresh = make_service(sessions, runs, think, scorer=scorer)  # a restarted society
    await fresh.on_progress(progress(RUN, 1, runs_pb2.RUN_STATE_SUCCEEDED), delivery())
    (policy,) = await rows(sessions, RlpPolicyRow)
    assert policy.normalizer["count"] == 4
    exps = await rows(sessions, RlpExperienceRow)
    assert len(exps) == 4
    step0 = [e for e in exps if e.generation == 0]
    step1 = [e for e in exps if e.generation == 1]
    mean1 = sum(e.normalized_reward for e in step1) / 2
    mean0 = sum(e.normalized_reward for e in step0) / 2
    for e in step0:  # A_0 = r_0 + gamma*lambda*A_1 (values 0, the run done)
        assert e.gae_advantage == pytest.approx(e.normalized_reward - mean0 + mean0 + 0.99 * 0.95 * mean1)
    async with sessions() as s:
        stats = await rlp_stats(s, RUN)
    assert (stats.steps, stats.steps_failed, stats.thoughts_rewarded, stats.buffer_size) == (2, 0, 4, 4)
    assert (stats.proposals, stats.proposals_resolved) == (4, 4)
    assert stats.hit_rate == pytest.approx(0.5)
    assert stats.mean_reward == pytest.approx(2.0)
    assert dict(stats.reward_definitions) == {"logprob_information_gain": 4}
    assert stats.trend in ("improving", "stable", "declining")


async def test_a_scoring_failure_fails_the_step(sessions) -> None:
    runs = FakeRuns(run_config())
    runs.add(0, {"t": 0.2, "n": 128}, 0.3)
    service = make_service(sessions, runs, FakeThinker(GOOD), scorer=FakeScorer(fail=True))
    await service.on_progress(progress(RUN, 0), delivery())
    runs.add(0, {"t": 0.9, "n": 512}, 0.9, origin="rlp")
    runs.generation = 1
    await service.on_progress(progress(RUN, 1), delivery())
    step0 = next(s for s in await rows(sessions, RlpStepRow) if s.generation == 0)
    assert (step0.state, step0.reason) == ("failed", "scoring_failed") and "500" in step0.detail
    assert await rows(sessions, RlpExperienceRow) == []


async def test_without_a_scorer_the_stated_predictions_are_scored_and_the_buffer_is_capped(sessions) -> None:
    runs = FakeRuns(run_config())
    runs.add(0, {"t": 0.2, "n": 128}, 0.3)
    think = FakeThinker(
        answer(("a", [(0.9, 512, 0.8)]), ("b", [(0.1, 256, 0.6)])),
        answer(("c", [(0.7, 512, 0.8)]), ("d", [(0.3, 256, 0.6)])),
        answer(("e", [(0.6, 512, 0.8)]), ("f", [(0.4, 256, 0.6)])),
    )
    service = make_service(sessions, runs, think, buffer_size=3)
    for gen, configs in enumerate([((0.9, 512), (0.1, 256)), ((0.7, 512), (0.3, 256)), ((0.6, 512), (0.4, 256))]):
        await service.on_progress(progress(RUN, gen), delivery())
        for (t, n), score in zip(configs, (0.7, 0.5), strict=True):
            runs.add(gen, {"t": t, "n": n}, score, origin="rlp")
        runs.generation = gen + 1
    await service.on_progress(progress(RUN, 3, runs_pb2.RUN_STATE_SUCCEEDED), delivery())
    exps = sorted(await rows(sessions, RlpExperienceRow), key=lambda e: e.id)
    assert len(exps) == 3  # 6 rewarded thoughts, the buffer keeps the newest 3
    assert [e.thought for e in exps] == ["d", "e", "f"]
    assert {e.definition for e in exps} == {"prediction_information_gain"}
    assert "no log-probability scorer" in exps[0].baseline
    # The best-rewarded experiences come back as few-shot examples of the space.
    async with sessions() as s:
        shots = await buffer.few_shot(s, exps[0].space_fingerprint, 2)
    assert len(shots) == 2 and all("Observed outcome" in x["outcome"] for x in shots)


async def test_runs_without_rlp_are_ignored_and_a_bad_society_block_is_one_failed_step(sessions) -> None:
    plain = FakeRuns({"search_space": {"t": [1, 2]}})
    think = FakeThinker(GOOD)
    await make_service(sessions, plain, think).on_progress(progress("run-plain", 0), delivery())
    assert think.calls == [] and await rows(sessions, RlpStepRow) == []

    bad = FakeRuns(
        {"search_space": {"t": [1, 2]}, "society": {"enabled": True, "learning": {"rlp_enabled": True, "bogus": 1}}}
    )
    service = make_service(sessions, bad, think)
    for gen in (0, 1, 2):
        await service.on_progress(progress("run-bad", gen), delivery())
    (step,) = await rows(sessions, RlpStepRow)
    assert (step.state, step.reason) == ("failed", "bad_config") and "society.learning.bogus" in step.detail
    assert think.calls == []

    other = FakeRuns(run_config(llm={"model": "openai/not-allowed"}))
    await make_service(sessions, other, think).on_progress(progress("run-model", 0), delivery())
    failed = next(s for s in await rows(sessions, RlpStepRow) if s.run_id == "run-model")
    assert failed.reason == "model_not_allowed" and think.calls == []


async def test_a_pending_run_is_ignored(sessions) -> None:
    runs = FakeRuns(run_config())
    think = FakeThinker(GOOD)
    await make_service(sessions, runs, think).on_progress(progress(RUN, 0, runs_pb2.RUN_STATE_PENDING), delivery())
    assert think.calls == [] and runs.config_calls == 0
