"""The HTTP routes: ``POST /v1/chat/completions`` (plain and ``stream: true`` server-sent
events), ``GET /v1/models`` and ``GET /health``. Errors use OpenAI's error body."""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any

from aiohttp import web

from flywheel.modelserver.engine import Engine, Generation
from flywheel.modelserver.protocol import (
    RequestError,
    chunk_body,
    completion_body,
    completion_id,
    parse_request,
    usage,
)

log = logging.getLogger(__name__)
ENGINE = web.AppKey("engine", Engine)
STARTED = int(time.time())


def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def build_app(engine: Engine, *, api_key: str | None = None) -> web.Application:
    """The aiohttp application; with ``api_key`` every /v1 route needs ``Authorization: Bearer <key>``."""
    expected = f"Bearer {api_key}".encode() if api_key else None

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        if expected is not None and request.path.startswith("/v1/"):
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return _error(RequestError("missing or wrong API key (Authorization: Bearer ...)", status=401))
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(RequestError(f"{request.method} {request.path}: {exc.reason}", status=exc.status))

    app = web.Application(middlewares=[errors], client_max_size=8 * 1024**2)
    app[ENGINE] = engine
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.on_cleanup.append(_close)
    return app


async def _close(app: web.Application) -> None:
    app[ENGINE].close()


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return web.json_response({"status": "ok", "models": engine.model_names(), "device": engine.base.device})


async def list_models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    data = [
        {
            "id": name,
            "object": "model",
            "created": STARTED,
            "owned_by": "flywheel",
            "root": engine.base.name,
            "parent": None if name == engine.base.name else engine.base.name,
        }
        for name in engine.model_names()
    ]
    return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    chat = parse_request(body)
    prepared = engine.prepare(chat)
    cid = completion_id()
    if not chat.stream:
        gen = await engine.complete(prepared)
        return web.json_response(
            completion_body(
                cid, prepared.model_name, gen.text, gen.finish_reason, gen.prompt_tokens, gen.completion_tokens
            )
        )

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    await send(chunk_body(cid, prepared.model_name, {"role": "assistant", "content": ""}))
    async for item in engine.stream(prepared):
        if isinstance(item, Generation):
            await send(chunk_body(cid, prepared.model_name, {}, finish_reason=item.finish_reason))
            if chat.stream_options and chat.stream_options.include_usage:
                used = usage(item.prompt_tokens, item.completion_tokens)
                await send(chunk_body(cid, prepared.model_name, {}, usage_=used))
        else:
            await send(chunk_body(cid, prepared.model_name, {"content": item}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
