"""The HTTP routes: ``POST /v1/chat/completions`` (plain and ``stream: true`` server-sent
events), ``POST /v1/completions`` (OpenAI's legacy completions with ``echo``/``logprobs`` and
vLLM's ``prompt_logprobs``; ``max_tokens: 0`` scores a text), ``GET /v1/models`` and
``GET /health``; with runtime loading on, vLLM's ``POST /v1/load_lora_adapter``
(``{"lora_name", "lora_path"}``) and ``POST /v1/unload_lora_adapter`` (``{"lora_name"}``).
Errors use OpenAI's error body."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from flywheel.modelserver.adapters import RuntimeLoading
from flywheel.modelserver.completions import completion_answer, wanted_top_k
from flywheel.modelserver.engine import Engine, Generation
from flywheel.modelserver.protocol import (
    RequestError,
    chunk_body,
    completion_body,
    completion_id,
    parse_completion_request,
    parse_request,
    text_completion_id,
    usage,
)

log = logging.getLogger(__name__)
# aiohttp's server options (web.run_app, AppRunner): a client that hangs up (a timed-out
# LiteLLM call) cancels its handler, which stops its generation at the next token
# (engine.Cancel) and frees the one generation thread for the next request.
SERVER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}
ENGINE = web.AppKey("engine", Engine)
RUNTIME = web.AppKey("runtime", RuntimeLoading)
SCRATCH = web.AppKey("scratch", Path)
STARTED = int(time.time())


def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def build_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    runtime: RuntimeLoading | None = None,
    scratch: Path | None = None,
) -> web.Application:
    """The aiohttp application; with ``api_key`` every /v1 route needs ``Authorization: Bearer <key>``.
    ``runtime``: adapters may be loaded and unloaded while serving, from those places only
    (None: the two routes answer 404); S3 prefixes are downloaded into ``scratch`` (a
    temporary folder per load, deleted once the adapter is in memory)."""
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
    if runtime is not None:
        app[RUNTIME] = runtime
        app[SCRATCH] = scratch or Path(tempfile.gettempdir())
    app.router.add_get("/health", health)
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
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


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None


def _runtime(request: web.Request) -> RuntimeLoading:
    runtime = request.app.get(RUNTIME)
    if runtime is None:
        raise RequestError(
            "runtime LoRA loading is off on this server (start it with --allow-runtime-lora or "
            "FLYWHEEL_MODELSERVER_ALLOW_RUNTIME_LORA=true)",
            status=404,
        )
    return runtime


async def _object_body(request: web.Request) -> dict[str, Any]:
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


async def load_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's runtime load: serve the adapter at ``lora_path`` as model ``lora_name``."""
    runtime = _runtime(request)
    engine = request.app[ENGINE]
    body = await _object_body(request)
    name = runtime.check_name(body.get("lora_name"))
    location = runtime.check_location(body.get("lora_path"))
    scratch = request.app[SCRATCH]

    async def load() -> None:
        with engine.reserve(name):
            scratch.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="lora-", dir=scratch) as tmp:
                folder = await asyncio.to_thread(runtime.fetch, location, Path(tmp))
                await engine.load_adapter(name, folder, source=location)
        log.info("loaded LoRA adapter %s from %s", name, location)

    # A client that hangs up does not cut a load in half: it finishes (or fails) on its own.
    await asyncio.shield(asyncio.ensure_future(load()))
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's runtime unload: stop serving model ``lora_name``."""
    runtime = _runtime(request)
    body = await _object_body(request)
    name = runtime.check_name(body.get("lora_name"))
    await request.app[ENGINE].unload_adapter(name)
    log.info("unloaded LoRA adapter %s", name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


async def completions(request: web.Request) -> web.Response:
    """OpenAI's legacy completions, scored on the engine's thread with the adapter named by ``model``."""
    engine = request.app[ENGINE]
    body = parse_completion_request(await _json_body(request))
    prepared = engine.prepare_completion(body)
    scored = await engine.complete_scored(prepared, top_k=wanted_top_k(body))
    return web.json_response(completion_answer(engine, body, scored, text_completion_id()))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    chat = parse_request(await _json_body(request))
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
