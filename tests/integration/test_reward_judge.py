"""The reward judge as a real process, its LLM a real local HTTP server (aiohttp) speaking
the OpenAI chat-completions API through LiteLLM, scripted to answer with malformed,
partial, truncated and valid JSON, errors and timeouts: the judge repairs, retries or
falls back, never crashes, and says when it fell back. Bad requests get INVALID_ARGUMENT
with a clear message and the service keeps serving."""

from __future__ import annotations

import math

import aiohttp
import grpc
import pytest
import pytest_asyncio

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1 import spans_pb2
from flywheel.reward_judge.testing.scripted_llm import ScriptedLlm

pytestmark = pytest.mark.integration

INVALID = grpc.StatusCode.INVALID_ARGUMENT
GOOD, BAD = "Paris is the capital of France. [good]", "London, I think. [bad]"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def llm():
    server = await ScriptedLlm(slow_s=3.0).start()
    yield server
    await server.stop()


@pytest.fixture(scope="module")
def judge_process(launch_module, llm):
    return launch_module(
        "reward_judge",
        env={
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/judge",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": llm.base_url,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-scripted",
            "FLYWHEEL_REWARD_JUDGE_LLM_TIMEOUT_S": "1",
            "FLYWHEEL_REWARD_JUDGE_LLM_ATTEMPTS": "3",
            "FLYWHEEL_REWARD_JUDGE_LLM_BACKOFF_S": "0.05",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",  # MiniLM is exercised by the unit tests
        },
    )


@pytest_asyncio.fixture(loop_scope="session")
async def judge(judge_process, llm):
    llm.reset(default="valid")
    async with grpc.aio.insecure_channel(
        judge_process.address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    ) as channel:
        yield pb_grpc.RewardJudgeServiceStub(channel)


def score(prompt: str, response: str, **kw) -> pb.ScoreRequest:
    return pb.ScoreRequest(prompt=prompt, response=response, **kw)


async def expect(call, code: grpc.StatusCode, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert words in info.value.details(), info.value.details()


async def test_repairable_answers_are_repaired(judge, llm):
    for i, mode in enumerate(["valid", "fenced", "trailing_comma", "truncated_tail", "overall"]):
        llm.push(mode)
        j = (await judge.Score(score(f"Capital of France? ({mode})", GOOD))).judgement
        assert not j.fallback_used, (mode, j.fallback_reason)
        assert j.judge == pb.JUDGE_KIND_LLM and j.judge_id == "llm:openai/judge"
        assert j.score == pytest.approx(0.9), mode
        assert llm.calls == i + 1, f"{mode} should need one call"
    assert set(j.components) == {"overall"}  # the "overall" answer kept its shape
    default = (await judge.GetRubric(pb.GetRubricRequest(name="default"))).rubric
    llm.push("valid")
    j = (await judge.Score(score("Capital of Spain?", BAD))).judgement
    assert set(j.components) == {c.name for c in default.criteria}
    assert j.score == pytest.approx(0.1)


async def test_unusable_answers_are_retried_then_succeed(judge, llm):
    llm.push("malformed", "error", "valid")
    j = (await judge.Score(score("Capital of Italy?", GOOD))).judgement
    assert not j.fallback_used and j.score == pytest.approx(0.9)
    assert llm.modes_served == ["malformed", "error", "valid"]

    llm.reset()
    llm.push("slow", "valid")  # the first answer comes after the 1 s timeout
    j = (await judge.Score(score("Capital of Peru?", GOOD))).judgement
    assert not j.fallback_used and llm.calls == 2


async def test_judge_that_keeps_failing_falls_back_and_says_so(judge, llm):
    llm.push("partial", "truncated", "out_of_range")
    j = (await judge.Score(score("Explain recursion.", "Recursion is when a function calls itself."))).judgement
    assert j.fallback_used
    assert j.judge == pb.JUDGE_KIND_HEURISTIC and j.judge_id == "heuristic"
    assert "failed 3 attempts" in j.fallback_reason and "outside 0-10" in j.fallback_reason
    assert set(j.components) == {"structure", "depth", "relevance"}  # no LLM criterion mixed in
    assert 0.0 <= j.score <= 1.0

    # With a reference the fallback is reference-based; fallbacks are not cached, so the
    # same request goes to the LLM again once it is back.
    llm.reset(default="error")
    req = score("What is 6 x 7?", "42", reference="The answer is 42.")
    j = (await judge.Score(req)).judgement
    assert j.fallback_used and j.judge == pb.JUDGE_KIND_REFERENCE
    assert {"exact_match", "token_f1"} <= set(j.components) and j.components["token_f1"] > 0
    assert not j.cached
    llm.reset(default="valid")
    again = (await judge.Score(req)).judgement
    assert not again.fallback_used and again.judge == pb.JUDGE_KIND_LLM and not again.cached
    cached = (await judge.Score(req)).judgement
    assert cached.cached and cached.score == again.score and llm.calls == 1


async def test_compare_is_judged_in_both_orders(judge, llm):
    c = await judge.Compare(pb.CompareRequest(prompt="Capital of France?", response_a=GOOD, response_b=BAD))
    assert c.orders_agree and not c.fallback_used
    assert c.prefer_a > 0.8 and c.prefer_a_forward == c.prefer_a_swapped
    assert llm.calls == 2
    # B first this time: the scripted judge still prefers the good answer, now B.
    c = await judge.Compare(pb.CompareRequest(prompt="Capital of France?", response_a=BAD, response_b=GOOD))
    assert c.prefer_a < 0.2 and c.orders_agree

    llm.push("position_biased", "position_biased")
    c = await judge.Compare(pb.CompareRequest(prompt="Which is better?", response_a="one", response_b="two"))
    assert not c.orders_agree
    assert c.prefer_a == pytest.approx(0.5)  # the bias cancels out instead of picking A
    assert c.prefer_a_forward > 0.5 > c.prefer_a_swapped

    rel = (await judge.GetReliability(pb.GetReliabilityRequest(judge_id="llm:openai/judge"))).judges[0]
    assert rel.swap_pairs >= 3 and rel.swap_agreement < 1.0
    assert rel.judgements > 0 and rel.fallbacks >= 1 and 0 < rel.fallback_rate < 1


async def test_rank_is_relative_and_cached(judge, llm):
    req = pb.RankRequest(prompt="Name the capital of France.", responses=[BAD, GOOD, "It might be Lyon or Paris."])
    r = await judge.Rank(req)
    scores = [j.score for j in r.judgements]
    assert scores[1] > scores[2] > scores[0]
    assert r.order_agreement == 1.0 and not r.fallback_used and not r.cached
    assert llm.calls == 2  # one call per presentation order, the whole group in each
    r2 = await judge.Rank(req)
    assert r2.cached and [j.score for j in r2.judgements] == scores and llm.calls == 2

    llm.reset(default="malformed")
    r3 = await judge.Rank(pb.RankRequest(prompt="Other?", responses=["a b c", "d e f"]))
    assert r3.fallback_used and all(j.fallback_used for j in r3.judgements) and math.isnan(r3.order_agreement)


async def test_bad_requests_get_clear_errors_and_the_service_keeps_serving(judge, llm):
    await expect(judge.Score(score("Q?", "")), INVALID, "response is empty")
    await expect(judge.Score(score("", "A")), INVALID, "prompt is empty")
    huge = "x" * (10 * 1024 * 1024)
    await expect(judge.Score(score("Q?", huge)), INVALID, "at most 100,000")
    await expect(judge.Score(score("Q?", "A", rubric="no_such_rubric")), INVALID, "'no_such_rubric' does not exist")
    await expect(judge.Rank(pb.RankRequest(prompt="Q?", responses=["only one"])), INVALID, "at least 2 responses")
    await expect(judge.Rank(pb.RankRequest(prompt="Q?", responses=["a", ""])), INVALID, "responses[1] is empty")
    await expect(judge.Score(score("Q?", "A", human_score=1.5)), INVALID, "human_score must be in [0, 1]")
    await expect(judge.Score(score("Q?", "A", judge=pb.JUDGE_KIND_REFERENCE)), INVALID, "needs a reference")
    await expect(judge.Aggregate(pb.AggregateRequest()), INVALID, "at least one candidate")
    assert llm.calls == 0
    j = (await judge.Score(score("Still there?", GOOD))).judgement
    assert j.score == pytest.approx(0.9)


async def test_rubrics_are_versioned(judge):
    listed = (await judge.ListRubrics(pb.ListRubricsRequest())).rubrics
    presets = {r.name for r in listed if r.preset}
    assert presets == {
        "default",
        "customer_service",
        "technical_support",
        "sales",
        "educational",
        "creative_writing",
        "code_assistance",
    }
    text = (
        "name: refunds\ndescription: Refund replies\n"
        "criteria:\n  - {name: policy, description: Follows policy, weight: 2}\n"
    )
    v1 = (await judge.PutRubric(pb.PutRubricRequest(yaml=text))).rubric
    v2 = (await judge.PutRubric(pb.PutRubricRequest(yaml=text.replace("weight: 2", "weight: 3")))).rubric
    assert (v1.version, v2.version) == (1, 2)
    got = await judge.GetRubric(pb.GetRubricRequest(name="refunds", version=1))
    assert got.rubric.criteria[0].weight == 2 and "refunds" in got.yaml
    assert (await judge.GetRubric(pb.GetRubricRequest(name="refunds"))).rubric.version == 2
    assert "refunds" in {r.name for r in (await judge.ListRubrics(pb.ListRubricsRequest())).rubrics}

    stale = pb.Rubric(name="refunds", version=2, criteria=[pb.Criterion(name="x", description="d", weight=1)])
    await expect(
        judge.PutRubric(pb.PutRubricRequest(rubric=stale)), grpc.StatusCode.FAILED_PRECONDITION, "next version is 3"
    )
    await expect(judge.PutRubric(pb.PutRubricRequest(yaml=text.replace("refunds", "sales"))), INVALID, "preset")
    await expect(judge.PutRubric(pb.PutRubricRequest(yaml="name: [unclosed")), INVALID, "does not parse")
    await expect(
        judge.PutRubric(pb.PutRubricRequest(yaml="name: neg\ncriteria:\n  - {name: a, description: d, weight: -1}")),
        INVALID,
        "weight must be a finite number > 0",
    )
    await expect(judge.GetRubric(pb.GetRubricRequest(name="nope")), grpc.StatusCode.NOT_FOUND, "known rubrics")

    j = (await judge.Score(score("Refund?", GOOD, rubric="refunds", rubric_version=1))).judgement
    assert (j.rubric, j.rubric_version) == ("refunds", 1) and set(j.components) == {"policy"}


async def test_human_agreement_and_metrics(judge, llm, judge_process):
    for i, (text, human) in enumerate([(GOOD, 1.0), (BAD, 0.0), ("word " * 60, 0.6), ("short", 0.2)]):
        await judge.Score(score(f"Question {i}?", text, human_score=human))
    rel = (await judge.GetReliability(pb.GetReliabilityRequest(judge_id="llm:openai/judge"))).judges[0]
    assert rel.human_labels == 4 and rel.spearman == pytest.approx(1.0) and rel.kendall == pytest.approx(1.0)
    url = f"http://127.0.0.1:{judge_process.metrics_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    assert 'flywheel_judge_human_spearman{judge="llm:openai/judge"} 1.0' in text
    assert "flywheel_judge_llm_calls_total" in text


async def test_aggregate_and_trace_rewards(judge):
    resp = await judge.Aggregate(
        pb.AggregateRequest(
            candidates=[
                pb.Candidate(
                    id="fast",
                    signals=[
                        pb.Signal(name="quality", value=0.6, min=0, max=1, weight=1),
                        pb.Signal(name="latency_ms", value=200, min=100, max=2100, weight=1, lower_is_better=True),
                        pb.Signal(name="thumbs", weight=5),  # absent: left out, not a zero
                    ],
                ),
                pb.Candidate(
                    id="slow",
                    signals=[
                        pb.Signal(name="quality", value=0.5, min=0, max=1, weight=1),
                        pb.Signal(name="latency_ms", value=2100, min=100, max=2100, weight=1, lower_is_better=True),
                    ],
                ),
            ]
        )
    )
    fast, slow = resp.results
    assert fast.total == pytest.approx((0.6 + 0.95) / 2) and set(fast.components) == {"quality", "latency_ms"}
    assert (fast.pareto_rank, slow.pareto_rank) == (0, 1)

    spans = [
        spans_pb2.Span(kind=spans_pb2.SPAN_KIND_TOOL, name="search", status=spans_pb2.SPAN_STATUS_OK),
        spans_pb2.Span(kind=spans_pb2.SPAN_KIND_TOOL, name="run", status=spans_pb2.SPAN_STATUS_ERROR),
        spans_pb2.Span(kind=spans_pb2.SPAN_KIND_REWARD, name="votes", reward=30, reward_min=0, reward_max=100),
    ]
    tr = await judge.TraceReward(pb.TraceRewardRequest(spans=spans, answer="Short answer."))
    by_name = {c.name: c for c in tr.components}
    assert by_name["tool_success"].raw == 0.0 and by_name["tool_success"].normalised == 0.5
    assert by_name["reward:votes"].raw == 30 and by_name["reward:votes"].normalised == pytest.approx(0.3)
    assert 0.0 <= tr.total <= 1.0
