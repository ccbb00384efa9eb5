"""An SAO round on real servers: the reward judge as a real process (its LLM a scripted local
OpenAI-compatible server, so that which pairs its two orders disagree on is known), S3 for
the dataset, and the trainer as a real process accepting the dataset as a DPO job (dry run).

Which parts are real and which scripted:

- ``test_sao_round_publishes_a_dataset_the_trainer_accepts``: the policy model is a scripted
  OpenAI-compatible HTTP server called through LiteLLM (for determinism of the generation
  step only: which prompts repeat, which ranking is prose). The reward judge is the real
  ``reward_judge`` process, called through ``JudgeClient.rank`` in both orders; its LLM is a
  scripted server that changes its mind between the two orders on two prompts (as a sampling
  judge does). Storage is real S3; the trainer is the real process.
- ``test_sao_round_on_the_local_model_server``: the policy model is the real local model
  server (SmolLM2-135M-Instruct when installed, else a tiny random model) through LiteLLM;
  its text may be anything, so the test checks the plumbing: every prompt is accounted
  for, kept or dropped with a reason (a garbage ranking is ``unparsable_ranking``)."""

from __future__ import annotations

import json
import re
from collections import Counter

import grpc
import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from pydantic import SecretStr

from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.core.judge_client import JudgeClient
from flywheel.core.llm import LlmSettings, load_litellm
from flywheel.core.objects import ObjectStore
from flywheel.core.settings import S3Settings
from flywheel.society.sao import LiteLlm, SaoConfig, SaoDataset, run_round

from .trainer_jobs import dpo_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GOOD = " It explains each step in order, names the trade-offs, and ends with a concrete example. [good]"
BAD = " Hard to say; it depends on a lot of things, so you might want to look it up elsewhere. [bad]"
TOPICS = [
    "keep a sourdough starter alive while travelling", "choose an index for an invoices table",
    "explain inflation with pocket money", "plan a cheap three-day trip to Lisbon",
    "stretch after a long shift on a hard floor", "tell whether a drug news story is overhyped",
    "ask a landlord to fix the heating", "learn to read sheet music as an adult",
    "split rent fairly between roommates", "get bread dough to rise in a cold kitchen",
    "rename hundreds of photos by date", "prepare for a driving theory exam",
    "negotiate a first salary offer", "compost in a small apartment", "teach a parent to use video calls",
    "choose a used bicycle",
]  # fmt: skip
PROMPTS = [f"How do I {t}?" for t in TOPICS]
DUPLICATES = [
    "how do i keep a sourdough starter alive while travelling",
    "HOW DO I SPLIT RENT FAIRLY BETWEEN ROOMMATES!",
]
FLIP = {PROMPTS[3], PROMPTS[7]}  # the judge's LLM changes its mind between the two orders
PROSE = PROMPTS[5]  # the policy answers the ranking request with prose


class Stub:
    """A real local HTTP server speaking OpenAI chat completions; ``answer`` writes the text."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _completions(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.calls += 1
        text = self.answer(payload["messages"][-1]["content"])
        return web.json_response(
            {
                "id": f"chatcmpl-{self.calls}",
                "object": "chat.completion",
                "created": 0,
                "model": payload.get("model", "stub"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )

    async def start(self) -> Stub:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def policy_answers():
    """The scripted policy: personas, prompts (in order, two of them repeats), one good and
    one bad response per prompt, and rankings naming the good one (prose for ``PROSE``)."""
    queue = PROMPTS[:8] + DUPLICATES[:1] + PROMPTS[8:] + DUPLICATES[1:]
    served: Counter[str] = Counter()

    def answer(text: str) -> str:
        if text.startswith("Describe the following person"):
            return text.split(": ", 1)[1].split("\n")[0] + " They keep a notebook of questions."
        if text.startswith("Persona:"):
            served["prompts"] += 1
            return queue[(served["prompts"] - 1) % len(queue)]
        if text.startswith("Compare two responses"):
            prompt = re.search(r"\[Prompt\]\n(.*?)\n\n\[Response A\]", text, re.S).group(1)
            if prompt == PROSE:
                return "Both are decent, but I would go with the first one overall."
            a = text.split("[Response A]\n", 1)[1].split("\n\n[Response B]")[0]
            return "ranking: A > B" if "[good]" in a else "Response B is clearer.\nranking: B > A"
        served[text] += 1
        return f"About '{text[:40]}':" + (GOOD if served[text] % 2 else BAD)

    return answer


def judge_answers():
    """The judge's scripted LLM: [good] scores 9 and [bad] 1, except on the ``FLIP`` prompts,
    where the second Rank call (the swapped order, its two passes) sees it the other way."""
    seen: Counter[str] = Counter()

    def answer(text: str) -> str:
        prompt = re.search(r"<prompt>\n(.*?)\n</prompt>", text, re.S).group(1)
        seen[prompt] += 1
        flipped = prompt in FLIP and seen[prompt] > 2
        criteria = re.findall(r"^- ([a-z][a-z0-9_]*): ", text.split("<prompt>")[0], re.M) or ["overall"]
        scores = []
        for rid, body in re.findall(r'<response id="(R\d+)">\n(.*?)\n</response>', text, re.S):
            q = 9 if ("[good]" in body) != flipped else 1
            scores.append({"id": rid, "criteria": {c: q for c in criteria}, "explanation": f"q{q}"})
        return json.dumps({"scores": scores})

    return answer


@pytest_asyncio.fixture(loop_scope="session")
async def judge_llm():
    stub = await Stub(judge_answers()).start()
    yield stub
    await stub.stop()


def start_judge(launch, judge_llm):
    return launch(
        "reward_judge",
        env={
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/judge",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": judge_llm.url,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-scripted",
            "FLYWHEEL_REWARD_JUDGE_LLM_ATTEMPTS": "1",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
        },
    )


def object_store(env: dict[str, str]) -> ObjectStore:
    return ObjectStore(
        S3Settings(
            endpoint=env["FLYWHEEL_S3_ENDPOINT"],
            access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
            secret_key=SecretStr(env["FLYWHEEL_S3_SECRET_KEY"]),
            bucket_prefix=env["FLYWHEEL_S3_BUCKET_PREFIX"],
        )
    )


def trainer_env(tmp_path) -> dict[str, str]:
    return {
        "FLYWHEEL_TRAINER_REPLICA_ID": "a",
        "FLYWHEEL_TRAINER_WORK_DIR": str(tmp_path / "work-a"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


async def test_sao_round_publishes_a_dataset_the_trainer_accepts(launch, judge_llm, tmp_path):
    await load_litellm()
    judge_process = start_judge(launch, judge_llm)
    trainer = launch("trainer", env=trainer_env(tmp_path), wait=False)  # starts while the round runs
    policy = await Stub(policy_answers()).start()
    judge = JudgeClient(judge_process.address, timeout_s=30)
    try:
        llm = LiteLlm.from_settings(
            LlmSettings(model="openai/policy", api_base=policy.url, api_key=SecretStr("sk-x"), timeout_s=10)
        )
        config = SaoConfig(n_personas=18, batch_size=6, seed=5, validation_fraction=0.1)
        result = await run_round(config, llm=llm, judge=judge, iteration=1)
    finally:
        await judge.close()
        await policy.stop()
    s = result.stats
    assert s.personas == 18 and s.prompts_generated == 18 and s.unique_prompts == 16
    assert s.prompt_repetition_rate == pytest.approx(2 / 18)
    assert s.dropped == {"duplicate_prompt": 2, "unparsable_ranking": 1, "judge_order_disagreement": 2}, s.dropped
    assert (s.judged, s.kept) == (15, 13)
    assert s.judge_order_agreement_rate == pytest.approx(13 / 15) and s.self_judge_agreement_rate == 1.0
    kept = {r.prompt for r in result.records}
    assert not kept & (FLIP | {PROSE}) and len(kept) == 13
    assert all("[good]" in r.chosen and "[bad]" in r.rejected for r in result.records)
    # Both orders reached the real judge's LLM: two passes per Rank, two Ranks per judged pair.
    assert judge_llm.calls == 4 * 15

    dataset = SaoDataset(result.records)
    objects = object_store(launch.env)
    published = await dataset.publish(
        objects, validation_fraction=0.1, params=config.model_dump(), stats=s.to_dict(), dataset_id="sao-it-1"
    )
    assert (published.train_rows, published.validation_rows) == (11, 2)
    manifest = json.loads(await objects.get_bytes("datasets", "preference/sao-it-1/manifest.json"))
    assert manifest["kind"] == "preference" and manifest["stats"]["dropped"]["judge_order_disagreement"] == 2
    train = (await objects.get_bytes("datasets", "preference/sao-it-1/train.jsonl")).decode()
    row = json.loads(train.splitlines()[0])
    assert {"prompt", "chosen", "rejected", "iteration", "timestamp"} <= set(row)
    assert SaoDataset.from_jsonl(train).records == SaoDataset(dataset.split(0.1)[0]).records

    trainer.wait_serving()
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        dry = (await stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(published.manifest_uri), dry_run=True))).dry_run
    assert (dry.samples, dry.validation_samples) == (11, 2) and dry.estimated_steps > 0


async def test_sao_round_on_the_local_model_server(launch, judge_llm, model_server):
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
