"""A real HTTP server speaking the OpenAI chat-completions API, scripted to answer like a
judge model does on a good or a bad day: valid JSON, JSON in prose and code fences,
trailing commas, truncated or partial JSON, no JSON at all, out-of-range scores, HTTP
500s, answers slower than the client's timeout, and a position-biased judge.

Used by the tests and ``bench/judge`` with LiteLLM pointed at it (``api_base``). Modes
pushed with :meth:`ScriptedLlm.push` (or ``POST /script``) answer the next calls in
order; after that every call gets the default mode. ``GET /stats`` counts the calls.

    python -m flywheel.reward_judge.testing.scripted_llm --port 8089 --delay-ms 150
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import deque
from typing import Any

from aiohttp import web

MODES = (
    "valid",
    "fenced",
    "trailing_comma",
    "truncated_tail",
    "truncated",
    "partial",
    "malformed",
    "out_of_range",
    "overall",
    "error",
    "slow",
    "position_biased",
)
_IDS = re.compile(r'<response id="(R\d+)">\n(.*?)\n</response>', re.S)
_CRITERIA = re.compile(r"^- ([a-z][a-z0-9_]*): ", re.M)


def quality(text: str) -> int:
    """The scripted judge's opinion: [good]/[bad] markers, else longer is a little better."""
    if "[good]" in text:
        return 9
    if "[bad]" in text:
        return 1
    return min(8, 2 + len(text.split()) // 20)


def _answer(prompt: str, mode: str) -> dict[str, Any]:
    shown = _IDS.findall(prompt)
    criteria = _CRITERIA.findall(prompt.split("<prompt>")[0]) or ["overall"]
    scores = []
    for pos, (rid, text) in enumerate(shown):
        q = (9 if pos == 0 else 2) if mode == "position_biased" else quality(text)
        if mode == "out_of_range":
            q = 42
        if mode == "overall":
            scores.append({"id": rid, "score": q, "explanation": "overall"})
        else:
            scores.append({"id": rid, "criteria": {c: q for c in criteria}, "explanation": f"quality {q}"})
    if mode == "partial":
        scores = scores[:1] if len(scores) > 1 else [{"id": shown[0][0], "explanation": "no scores"}]
    return {"scores": scores}


def render(prompt: str, mode: str) -> str:
    """The text the scripted model answers with in ``mode``."""
    body = json.dumps(_answer(prompt, mode))
    if mode == "fenced":
        return f"Here is my judgement.\n```json\n{body}\n```\nI hope this helps."
    if mode == "trailing_comma":
        return body[:-2] + ",]}"
    if mode == "truncated_tail":
        return body[:-2]  # cut before the closing "]}": repairable
    if mode == "truncated":
        return body[: max(12, len(body) // 3)]  # cut mid-way: ids or criteria go missing
    if mode == "malformed":
        return "I think the first response is better because it is more detailed."
    return body


class ScriptedLlm:
    """The server; ``base_url`` is what LiteLLM takes as ``api_base``."""

    def __init__(self, *, default: str = "valid", delay_s: float = 0.0, slow_s: float = 5.0) -> None:
        if default not in MODES:
            raise ValueError(f"unknown mode {default!r}")
        self.default = default
        self.delay_s = delay_s
        self.slow_s = slow_s
        self.script: deque[str] = deque()
        self.calls = 0
        self.modes_served: list[str] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *modes: str) -> None:
        for m in modes:
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; one of {MODES}")
        self.script.extend(modes)

    def reset(self, default: str | None = None) -> None:
        self.script.clear()
        self.calls = 0
        self.modes_served.clear()
        if default:
            self.default = default

    async def _completions(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.calls += 1
        mode = self.script.popleft() if self.script else self.default
        self.modes_served.append(mode)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if mode == "error":
            return web.json_response({"error": {"message": "scripted failure", "type": "server_error"}}, status=500)
        if mode == "slow":
            await asyncio.sleep(self.slow_s)
        prompt = "\n".join(str(m.get("content", "")) for m in payload.get("messages", []))
        text = render(prompt, mode)
        return web.json_response(
            {
                "id": f"chatcmpl-{self.calls}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": payload.get("model", "scripted"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": len(prompt) // 4,
                    "completion_tokens": len(text) // 4,
                    "total_tokens": (len(prompt) + len(text)) // 4,
                },
            }
        )

    async def _script(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            if body.get("reset"):
                self.reset(body.get("default"))
            self.push(*body.get("modes", []))
            if "delay_s" in body:
                self.delay_s = float(body["delay_s"])
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"queued": len(self.script)})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": self.calls, "queued": len(self.script)})

    async def start(self, port: int = 0) -> ScriptedLlm:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/chat/completions", self._completions)
        app.router.add_post("/script", self._script)
        app.router.add_get("/stats", self._stats)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _serve(port: int, delay_s: float, default: str) -> None:
    server = await ScriptedLlm(default=default, delay_s=delay_s).start(port)
    print(f"scripted LLM on {server.base_url}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--default", default="valid", choices=MODES)
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.delay_ms / 1000, args.default))


if __name__ == "__main__":
    main()
