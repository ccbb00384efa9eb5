"""Every judge path answers within its deadline: the LLM judge falls back, model calls
(embeddings, reward model) raise DEADLINE_EXCEEDED naming the setting, and a timed-out
model thread keeps its slot until it really ends, so stuck calls cannot pile up."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from flywheel.reward_judge import rubric
from flywheel.reward_judge.bounded import ModelCalls
from flywheel.reward_judge.errors import JudgeTimedOut
from flywheel.reward_judge.llm_judge import LlmJudge, LlmJudgeConfig
from flywheel.reward_judge.service import JudgeService, Limits
from flywheel.reward_judge.testing.scripted_llm import ScriptedLlm


class Presets:
    async def get(self, name: str, version: int = 0) -> rubric.Rubric:
        return rubric.presets()[name or "default"]


class StuckEmbedder:
    """An embedding model that does not answer until released (a hung model load)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def similarities(self, pairs):
        self.release.wait(30)
        return [0.5 for _ in pairs]


async def test_a_timed_out_model_call_keeps_its_slot_until_its_thread_ends():
    calls = ModelCalls(in_flight=1)
    gate = threading.Event()
    started = time.monotonic()
    with pytest.raises(JudgeTimedOut, match=r"within 0.2s \(SETTING_X\)") as info:
        await calls.run(lambda: gate.wait(30), deadline_s=0.2, what="test model", setting="SETTING_X")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 2
    # The stuck thread still holds the only slot: the next call waits, then times out too.
    with pytest.raises(JudgeTimedOut):
        await calls.run(lambda: 1, deadline_s=0.2, what="test model", setting="SETTING_X")
    gate.set()
    assert await calls.run(lambda: 2, deadline_s=5, what="test model", setting="SETTING_X") == 2
    calls.close()


async def test_embedding_judge_and_reference_fallback_are_bounded():
    embedder = StuckEmbedder()
    svc = JudgeService(
        rubrics=Presets(),
        llm=None,
        embedder=embedder,
        limits=Limits(embedding_deadline_s=0.3),  # type: ignore[arg-type]
    )
    started = time.monotonic()
    with pytest.raises(JudgeTimedOut, match="FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S"):
        await svc.score(prompt="Capital of France?", response="Paris.", judge="embedding")
    assert time.monotonic() - started < 3
    # A reference fallback must answer: it drops the embedding component instead of failing.
    j = await svc.score(prompt="Capital of France?", response="Paris", reference="Paris", judge="reference")
    assert set(j.components) == {"exact_match", "token_f1"} and j.score == 1.0
    embedder.release.set()


async def test_llm_judge_past_its_deadline_falls_back_and_says_why():
    llm = await ScriptedLlm(default="slow", slow_s=5).start()
    try:
        judge = LlmJudge(LlmJudgeConfig("openai/judge", llm.base_url, "sk-x", timeout_s=10, attempts=3, backoff_s=0))
        svc = JudgeService(rubrics=Presets(), llm=judge, limits=Limits(llm_deadline_s=0.5))
        started = time.monotonic()
        j = await svc.score(prompt="Capital of France?", response="Paris is the capital.")
        assert time.monotonic() - started < 3
        assert j.fallback_used and "FLYWHEEL_REWARD_JUDGE_LLM_DEADLINE_S" in j.fallback_reason
        r = await svc.rank(prompt="Capital of France?", responses=["Paris.", "Lyon."])
        assert r.fallback_used and time.monotonic() - started < 5
    finally:
        await llm.stop()
