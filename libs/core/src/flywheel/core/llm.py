"""LLM calls through LiteLLM, with timeouts, retries and cost accounting.

LiteLLM is an optional extra (``flywheel-core[llm]``): only services that call models
install it. It is imported lazily, after forcing offline mode for its cost map; the import
takes seconds, so async services call `load_litellm` first to keep it off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class LlmSettings(BaseSettings):
    """Default model and limits for a service's LLM calls."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_LLM_", extra="ignore")

    model: str = "openai/local"
    # OpenAI-compatible base URL (the local model server, vLLM, a proxy…).
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = 30.0
    max_retries: int = 2


@dataclass(frozen=True)
class Completion:
    """One chat completion with what it cost."""

    text: str
    model: str
    latency_ms: float
    input_tokens: int
    output_tokens: int
    cost_usd: float


_import_lock = threading.Lock()
_litellm: Any = None  # the configured module, once imported


def _import_litellm() -> Any:
    global _litellm
    with _import_lock:  # one import, configured once, whichever thread gets here first
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm  # heavy; only services that call models pay for it

            litellm.telemetry = False
            litellm.suppress_debug_info = True  # no "Give Feedback" banners in service logs
            _litellm = litellm
        return _litellm


async def load_litellm() -> None:
    """Import LiteLLM on a daemon thread and wait for it; `LlmClient` is then instant.

    Not ``asyncio.to_thread``: ``asyncio.run`` joins its default executor's threads on exit,
    and the import, without a warm .pyc cache, outlasts the 10 s a pod gets to stop."""
    if _litellm is not None:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            _import_litellm()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed first: nobody is waiting
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="litellm-import", daemon=True).start()
    await done


class LlmClient:
    """Chat completions with the service's defaults; every call is bounded in time."""

    def __init__(self, settings: LlmSettings) -> None:
        self._settings = settings
        self._litellm = _import_litellm()

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        model: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        response_format: dict[str, Any] | None = None,
        **params: Any,
    ) -> Completion:
        """Call the model; raises after ``max_retries`` failed attempts or the timeout.
        ``params`` (top_p, seed, stop, …) go to LiteLLM as they are."""
        s = self._settings
        started = time.perf_counter()
        resp = await self._litellm.acompletion(
            model=model or s.model,
            messages=messages,
            temperature=temperature,
            max_tokens=max_tokens,
            response_format=response_format,
            api_base=s.api_base,
            api_key=s.api_key.get_secret_value() if s.api_key else None,
            timeout=s.timeout_s,
            num_retries=s.max_retries,
            **params,
        )
        usage = getattr(resp, "usage", None)
        try:
            cost = float(self._litellm.completion_cost(completion_response=resp))
        except Exception:  # noqa: BLE001 - unknown (local) models have no price
            cost = 0.0
        return Completion(
            text=resp.choices[0].message.content or "",
            model=str(resp.model),
            latency_ms=(time.perf_counter() - started) * 1000,
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost_usd=cost,
        )
