"""What SAO needs from a language model and from the reward judge, and the LiteLLM adapter.

An LLM call's failure is turned into a reason that the round counts (``llm_timeout``,
``llm_error``, ``llm_empty``, ``llm_rejected_response_format``) instead of an exception that
stops the round.

A model whose server enforces OpenAI's ``response_format`` while generating (the local model
server, vLLM) says so with ``structured_output = True``; steps that need a machine-readable
answer (the self-ranking) then send a JSON schema, and plain text otherwise."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol


class Llm(Protocol):
    """A chat model: the policy model that writes personas, prompts, responses and rankings.
    ``response_format`` is only passed when :func:`structured_output` says the model takes it."""

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str: ...


class Ranker(Protocol):
    """The reward judge's Rank (``flywheel.core.judge_client.JudgeClient`` fits)."""

    async def rank(self, prompt: str, responses: list[str], rubric: str = "") -> list[float]: ...


class LiteLlm:
    """:class:`Llm` over ``flywheel.core.llm.LlmClient`` (LiteLLM: any provider, or the local
    model server through ``api_base``). ``structured_output``: send ``response_format`` where a
    step asks for it (FLYWHEEL_SOCIETY_SAO_STRUCTURED_OUTPUT)."""

    def __init__(self, client: object, *, structured_output: bool = False) -> None:
        self._client = client
        self.structured_output = structured_output

    @classmethod
    def from_settings(cls, settings: object, *, structured_output: bool = False) -> LiteLlm:
        from flywheel.core.llm import LlmClient

        return cls(LlmClient(settings), structured_output=structured_output)  # type: ignore[arg-type]

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        extra: dict[str, Any] = {}
        if response_format is not None:
            # drop_params: LiteLLM leaves response_format out for providers it knows lack it.
            extra = {"response_format": response_format, "drop_params": True}
        got = await self._client.complete(messages, temperature=temperature, max_tokens=max_tokens, **extra)  # type: ignore[attr-defined]
        return got.text


def structured_output(llm: object) -> bool:
    """Whether ``llm`` takes OpenAI's ``response_format`` (its ``structured_output`` attribute)."""
    return bool(getattr(llm, "structured_output", False))


@dataclass(frozen=True)
class Answer:
    """An LLM answer, or the reason there is none."""

    text: str = ""
    failure: str = ""  # "", "llm_timeout", "llm_error", "llm_empty" or "llm_rejected_response_format"
    detail: str = ""


def _is_timeout(exc: BaseException) -> bool:
    # LiteLLM's Timeout derives from openai.APITimeoutError; neither is imported here.
    return isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()


async def ask(
    llm: Llm,
    messages: list[dict[str, str]],
    *,
    temperature: float,
    max_tokens: int,
    timeout_s: float,
    response_format: dict[str, Any] | None = None,
) -> Answer:
    """One bounded call; never raises for the model's own failures. ``response_format`` is
    passed on only when given (a plain :class:`Llm` need not accept it)."""
    extra = {} if response_format is None else {"response_format": response_format}
    try:
        text = await asyncio.wait_for(
            llm.complete(messages, temperature=temperature, max_tokens=max_tokens, **extra), timeout_s
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any provider error is a counted failure of this step
        reason = "llm_timeout" if _is_timeout(exc) else "llm_error"
        if reason == "llm_error" and extra and "response_format" in str(exc):
            reason = "llm_rejected_response_format"  # a provider that refuses it (see structured_output)
        return Answer(failure=reason, detail=f"{type(exc).__name__}: {exc}"[:300])
    text = (text or "").strip()
    if not text:
        return Answer(failure="llm_empty")
    return Answer(text=text)
