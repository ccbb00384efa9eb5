"""``LlmThinker`` through the real LiteLLM to an OpenAI-compatible server (an in-process fake
that records the body): the thoughts' ``response_format`` reaches the server as it was built,
and nothing is sent when the society asks for none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from flywheel.core.llm import LlmSettings
from flywheel.society.rlp.schema import thoughts_response_format
from flywheel.society.rlp.service import LlmThinker

from .rlp_fakes import GOOD, SPACE


async def test_the_response_format_reaches_an_openai_compatible_server() -> None:
    bodies: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": GOOD}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server:
        llm = LlmSettings(model="openai/smollm2", api_base=str(server.make_url("/v1")), api_key="k", max_retries=0)
        think = LlmThinker(SimpleNamespace(llm=llm))  # type: ignore[arg-type]  # it reads .llm only
        fmt = thoughts_response_format(SPACE, n_thoughts=2, proposals_per_thought=1, thought_length=256)
        messages = [{"role": "user", "content": "think"}]
        text = await think(messages, model="openai/smollm2", temperature=0.7, max_tokens=256, response_format=fmt)
        assert text == GOOD
        await think(messages, model="openai/smollm2", temperature=0.7, max_tokens=256)
    assert bodies[0]["response_format"] == fmt and bodies[0]["model"] == "smollm2"
    assert "response_format" not in bodies[1]
