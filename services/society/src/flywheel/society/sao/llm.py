"""What SAO needs from a language model and from the reward judge, and the LiteLLM adapter.

An LLM call's failure is turned into a reason that the round counts (``llm_timeout``,
``llm_error``, ``llm_empty``) instead of an exception that stops the round."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol


class Llm(Protocol):
    """A chat model: the policy model that writes personas, prompts, responses and rankings."""

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str: ...


class Ranker(Protocol):
    """The reward judge's Rank (``flywheel.core.judge_client.JudgeClient`` fits)."""

    async def rank(self, prompt: str, responses: list[str], rubric: str = "") -> list[float]: ...


class LiteLlm:
    """:class:`Llm` over ``flywheel.core.llm.LlmClient`` (LiteLLM: any provider, or the local
    model server through ``api_base``)."""

    def __init__(self, client: object) -> None:
        self._client = client

    @classmethod
    def from_settings(cls, settings: object) -> LiteLlm:
        from flywheel.core.llm import LlmClient

        return cls(LlmClient(settings))  # type: ignore[arg-type]

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        got = await self._client.complete(messages, temperature=temperature, max_tokens=max_tokens)  # type: ignore[attr-defined]
        return got.text


@dataclass(frozen=True)
class Answer:
    """An LLM answer, or the reason there is none."""

    text: str = ""
    failure: str = ""  # "", "llm_timeout", "llm_error" or "llm_empty"
    detail: str = ""


def _is_timeout(exc: BaseException) -> bool:
    # LiteLLM's Timeout derives from openai.APITimeoutError; neither is imported here.
    return isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()


async def ask(
    llm: Llm, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, timeout_s: float
) -> Answer:
    """One bounded call; never raises for the model's own failures."""
    try:
        text = await asyncio.wait_for(llm.complete(messages, temperature=temperature, max_tokens=max_tokens), timeout_s)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any provider error is a counted failure of this step
        reason = "llm_timeout" if _is_timeout(exc) else "llm_error"
        return Answer(failure=reason, detail=f"{type(exc).__name__}: {exc}"[:300])
    text = (text or "").strip()
    if not text:
        return Answer(failure="llm_empty")
    return Answer(text=text)
