"""Calling what is evaluated: an LLM through LiteLLM, an HTTP endpoint, or a Python
callable. One call per attempt, bounded by a timeout; :func:`call_with_retries` retries
transient failures (timeouts, connection errors, 429, 5xx) with exponential backoff and
jitter, and gives up at once on the rest (a 400, a missing API key, a bad import path).

Secrets (API keys, auth headers) are read from the environment variables the request
names, at call time, and never logged or put into results or traces. Every call checks the
run policy again (:mod:`flywheel.core.run_policy`: which variables, callables and hosts a
request may name) right before it reads a variable, imports a module or opens a connection,
so nothing reaches a secret, code or host the policy refuses even if validation was skipped."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from flywheel.api.evaluator.v1.events_pb2 import HttpTarget, LlmTarget
from flywheel.core import callables
from flywheel.core.llm import LlmClient, LlmSettings, load_litellm
from flywheel.core.run_policy import RunPolicySettings, env_names
from flywheel.evaluator.templating import TemplateError, lookup, render_body, render_text

# Config keys passed to the model as sampling parameters; other keys are prompt settings.
LLM_PARAMS = ("top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "response_format")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Sent as the key when an LLM target names an api_base but no key variable, so LiteLLM does
# not fall back to a provider key in this process's environment (OPENAI_API_KEY...) and send
# it to a host the request chose.
NO_KEY = "no-key"


@dataclass
class CallResult:
    """What one successful call returned and what it cost."""

    output: str
    prompt: str
    latency_ms: float
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    attempts: int = 1


class TargetError(Exception):
    """A failed call; ``retryable`` says whether another attempt may succeed."""

    def __init__(self, message: str, *, retryable: bool, attempts: int = 1) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.attempts = attempts


@dataclass(frozen=True)
class CallContext:
    """The test case's input and the candidate config, as plain JSON values."""

    input: dict[str, Any]
    config: dict[str, Any]
    test_case_id: str

    def template_values(self) -> dict[str, Any]:
        return {**self.config, "config": self.config, "input": self.input, "test_case_id": self.test_case_id}


async def call_with_retries(
    call: Callable[[], Awaitable[CallResult]],
    *,
    attempts: int,
    timeout_s: float,
    backoff_s: float,
    rng: random.Random | None = None,
) -> CallResult:
    """Run ``call`` until it succeeds, fails for good, or ``attempts`` are used up."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not security
    for attempt in range(1, attempts + 1):
        try:
            result = await asyncio.wait_for(call(), timeout_s)
            result.attempts = attempt
            return result
        except TimeoutError:
            error = TargetError(f"timed out after {timeout_s:g}s", retryable=True)
        except TargetError as exc:
            error = exc
        if not error.retryable or attempt == attempts:
            raise TargetError(
                f"{error} (attempt {attempt} of {attempts})", retryable=error.retryable, attempts=attempt
            ) from error
        await asyncio.sleep(backoff_s * 2 ** (attempt - 1) * (0.5 + rng.random()))
    raise AssertionError("unreachable")


def _env(name: str, *, what: str, policy: RunPolicySettings) -> str:
    problem = policy.env_problem(name)
    if problem:
        raise TargetError(f"{what}: {problem}", retryable=False)
    value = os.environ.get(name)
    if value is None:
        raise TargetError(f"environment variable {name} ({what}) is not set on this evaluator", retryable=False)
    return value


# -- LLM --------------------------------------------------------------------------------------
def chat_messages(ctx: CallContext) -> list[dict[str, str]]:
    """The chat for an LLM target: the input's ``messages`` if it has them, else one user
    message from ``config.prompt_template`` (``{{input.question}}``…) or the input's
    ``prompt``/``question``/``text`` (or its JSON); ``config.system_prompt`` goes first."""
    messages = ctx.input.get("messages")
    if isinstance(messages, list):
        chat = [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in messages]
    else:
        template = ctx.config.get("prompt_template")
        if isinstance(template, str):
            try:
                content = render_text(template, ctx.template_values())
            except TemplateError as exc:
                raise TargetError(f"config.prompt_template: {exc}", retryable=False) from None
        else:
            found = next((ctx.input[k] for k in ("prompt", "question", "text", "input") if k in ctx.input), None)
            content = found if isinstance(found, str) else json.dumps(ctx.input)
        chat = [{"role": "user", "content": content}]
    system = ctx.config.get("system_prompt")
    if isinstance(system, str) and system:
        chat.insert(0, {"role": "system", "content": system})
    return chat


def check_url(url: str, *, what: str, policy: RunPolicySettings, llm: bool = False) -> None:
    """Refuse a URL the policy does not allow, and one that httpx would send to another host
    than the policy checked (a parser differential, with a host allow-list)."""
    problem = policy.url_problem(url, llm=llm)
    if problem:
        raise TargetError(f"{what}: {problem}", retryable=False)
    if url and policy.allowed_hosts:
        checked = (urlsplit(url).hostname or "").lower().rstrip(".")
        try:
            sent = httpx.URL(url).host.lower().rstrip(".")
        except (httpx.InvalidURL, ValueError) as exc:
            raise TargetError(f"{what}: {url!r} is not a valid URL ({exc})", retryable=False) from None
        if sent != checked:
            raise TargetError(f"{what}: {url!r} is read as host {sent!r} and as {checked!r}", retryable=False)


async def call_llm(target: LlmTarget, ctx: CallContext, *, policy: RunPolicySettings) -> CallResult:
    """One chat completion through LiteLLM (``config.model`` overrides the target's model)."""
    model = str(ctx.config.get("model") or target.model)
    check_url(target.api_base, what="target.llm.api_base", policy=policy, llm=True)
    api_key = (
        _env(target.api_key_env, what="target.llm.api_key_env", policy=policy)
        if target.api_key_env
        else (NO_KEY if target.api_base else None)
    )
    await load_litellm()  # the first call would otherwise import LiteLLM on the event loop
    client = LlmClient(
        LlmSettings(model=model, api_base=target.api_base or None, api_key=api_key, max_retries=0, timeout_s=3600)
    )
    messages = chat_messages(ctx)
    params = {k: ctx.config[k] for k in LLM_PARAMS if k in ctx.config}
    max_tokens = ctx.config.get("max_tokens")
    try:
        done = await client.complete(
            messages,
            model=model,
            temperature=float(ctx.config.get("temperature", 0.0)),
            max_tokens=int(max_tokens) if max_tokens is not None else None,
            **params,
        )
    except Exception as exc:  # noqa: BLE001 - LiteLLM maps every provider error to its own classes
        status = getattr(exc, "status_code", None)
        retryable = status is None or status in (408, 409, 429) or int(status) >= 500
        text = str(exc).replace(api_key, "***") if api_key and api_key != NO_KEY else str(exc)  # never echo a key
        raise TargetError(f"{type(exc).__name__}: {_short(text)}", retryable=retryable) from None
    return CallResult(
        output=done.text,
        prompt=json.dumps(messages),
        latency_ms=done.latency_ms,
        cost_usd=done.cost_usd,
        input_tokens=done.input_tokens,
        output_tokens=done.output_tokens,
        model=model,
    )


# -- HTTP -------------------------------------------------------------------------------------
def http_headers(target: HttpTarget, *, policy: RunPolicySettings) -> dict[str, str]:
    """Static headers plus those read from the environment (``VAR`` or ``Bearer ${VAR}``)."""
    headers = dict(target.headers)
    for name, ref in target.header_envs.items():
        what = f"target.http.header_envs[{name}]"
        for var in env_names(ref) or [ref]:  # every name is checked before any is read
            problem = policy.env_problem(var)
            if problem:
                raise TargetError(f"{what}: {problem}", retryable=False)
        if "${" in ref:
            headers[name] = _ENV_REF.sub(lambda m, what=what: _env(m.group(1), what=what, policy=policy), ref)
        else:
            headers[name] = _env(ref, what=what, policy=policy)
    return headers


async def call_http(
    target: HttpTarget, ctx: CallContext, client: httpx.AsyncClient, *, policy: RunPolicySettings
) -> CallResult:
    """One HTTP call with the templated body; the output is read at ``response_path``.
    Without a body template a POST/PUT/PATCH sends the test input merged with the candidate's
    params (the params win), as The Convergence did, so every candidate sends its own request."""
    check_url(target.url, what="target.http.url", policy=policy)
    method = (target.method or "POST").upper()
    try:
        if target.body_template:
            body = render_body(target.body_template, ctx.template_values())
        else:
            body = {**ctx.input, **ctx.config} if method in ("POST", "PUT", "PATCH") else None
    except TemplateError as exc:
        raise TargetError(f"target.http.body_template: {exc}", retryable=False) from None
    headers = http_headers(target, policy=policy)
    started = time.perf_counter()
    try:
        resp = await client.request(method, target.url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise TargetError(f"{method} {target.url}: {type(exc).__name__}: {exc}", retryable=True) from None
    latency_ms = (time.perf_counter() - started) * 1000
    if resp.status_code >= 400:
        retryable = resp.status_code in (408, 429) or resp.status_code >= 500
        raise TargetError(f"{method} {target.url} -> {resp.status_code}: {_short(resp.text)}", retryable=retryable)
    try:
        data: Any = resp.json()
    except ValueError:
        data = resp.text
    if target.response_path:
        try:
            data = lookup(target.response_path, data)
        except TemplateError as exc:
            raise TargetError(f"target.http.response_path: {exc}", retryable=False) from None
    output = data if isinstance(data, str) else json.dumps(data)
    return CallResult(output=output, prompt=json.dumps(body) if body is not None else "", latency_ms=latency_ms)


# -- Python -----------------------------------------------------------------------------------
def resolve_callable(path: str, *, what: str, policy: RunPolicySettings) -> Callable[..., Any]:
    """Import ``package.module:function`` if the policy allows it (the checks of
    :func:`flywheel.core.callables.resolve_callable`, shared with the trainer); TargetError
    naming the problem if it does not, or if it fails."""
    try:
        return callables.resolve_callable(path, what=what, policy=policy)
    except callables.CallableRefused as exc:
        raise TargetError(str(exc), retryable=False) from None


async def call_python(path: str, ctx: CallContext, *, policy: RunPolicySettings) -> CallResult:
    """Call ``fn(input, config)``; it returns the output text, or a dict with ``output`` and
    optionally ``cost_usd``, ``input_tokens``, ``output_tokens``. Sync functions run in a
    worker thread (a timed-out one finishes in the background)."""
    fn = resolve_callable(path, what="target.python_callable", policy=policy)
    started = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(fn):
            value = await fn(ctx.input, ctx.config)
        else:
            value = await asyncio.to_thread(fn, ctx.input, ctx.config)
    except (TimeoutError, ConnectionError) as exc:
        raise TargetError(f"{path}: {type(exc).__name__}: {exc}", retryable=True) from None
    except Exception as exc:  # noqa: BLE001 - the user's function failed; that is the outcome
        raise TargetError(f"{path} raised {type(exc).__name__}: {_short(str(exc))}", retryable=False) from None
    latency_ms = (time.perf_counter() - started) * 1000
    prompt = json.dumps(ctx.input)
    if isinstance(value, dict):
        return CallResult(
            output=str(value.get("output", "")),
            prompt=prompt,
            latency_ms=latency_ms,
            cost_usd=float(value.get("cost_usd", 0.0) or 0.0),
            input_tokens=int(value.get("input_tokens", 0) or 0),
            output_tokens=int(value.get("output_tokens", 0) or 0),
        )
    return CallResult(output="" if value is None else str(value), prompt=prompt, latency_ms=latency_ms)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
