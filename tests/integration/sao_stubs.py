"""Scripted LLM servers for the SAO tests: a real local HTTP server speaking OpenAI chat
completions whose answers are written by a function, the policy model's script (personas,
prompts with two repeats, a good and a bad response per prompt, rankings naming the good one,
prose for one prompt) and the reward judge's LLM script (it changes its mind between the two
orders on two prompts, as a sampling judge does). Shared by test_sao_round (the library on
real servers) and test_society_service (the service end to end).

With ``SaoConfig(n_personas=18, seed=5)`` one round gives: 18 prompts, 16 unique; dropped
duplicate_prompt 2, unparsable_ranking 1, judge_order_disagreement 2; 15 judged, 13 kept."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest_asyncio
from aiohttp import web

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


def start_judge_args(judge_llm) -> dict:
    """``launch`` arguments of the reward judge whose LLM is the scripted ``judge_llm``."""
    return {
        "name": "reward_judge",
        "env": {
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/judge",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": judge_llm.url,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-scripted",
            "FLYWHEEL_REWARD_JUDGE_LLM_ATTEMPTS": "1",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
        },
    }


def start_judge(launch, judge_llm):
    return launch(**start_judge_args(judge_llm))


def trainer_env(tmp_path) -> dict[str, str]:
    return {
        "FLYWHEEL_TRAINER_REPLICA_ID": "a",
        "FLYWHEEL_TRAINER_WORK_DIR": str(tmp_path / "work-a"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
