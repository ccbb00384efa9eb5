"""The LLM judge: one call per group through LiteLLM (flywheel.core.llm), temperature 0,
each answer parsed strictly (after a bounded repair), and asked again with exponential
backoff when the call fails, times out or the answer is unusable."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from flywheel.core.llm import LlmClient, LlmSettings, load_litellm
from flywheel.core.logging import get_logger
from flywheel.reward_judge.errors import JudgeFailed
from flywheel.reward_judge.metrics import LLM_CALLS
from flywheel.reward_judge.parsing import ItemScore, MalformedAnswer, extract_json, read_scores
from flywheel.reward_judge.prompts import judge_messages, label
from flywheel.reward_judge.rubric import Rubric

log = get_logger(__name__)
# Client errors the provider will repeat for the same request (bad request, auth, no such
# model, unprocessable): retrying only delays the fallback.
_NOT_RETRIED = frozenset({400, 401, 403, 404, 422})


@dataclass(frozen=True)
class LlmJudgeConfig:
    model: str
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 0.5
    max_tokens: int = 1024


@dataclass(frozen=True)
class GroupScores:
    """Scores of the responses in the order they were shown, and what it took."""

    items: list[ItemScore]
    attempts: int
    repaired: bool


class LlmJudge:
    """Judges a group of responses to one prompt in one call."""

    def __init__(self, config: LlmJudgeConfig) -> None:
        self.config = config
        self.judge_id = f"llm:{config.model}"
        # Our own attempts below (so a malformed answer is retried like an error): LiteLLM's off.
        self._settings = LlmSettings(
            model=config.model,
            api_base=config.api_base,
            api_key=config.api_key,
            timeout_s=config.timeout_s,
            max_retries=0,
        )
        self._client: LlmClient | None = None
        self.calls = 0

    async def warm(self) -> None:
        """Import LiteLLM (seconds) off the event loop, so neither startup, the loop nor a
        shutdown waits on it (`load_litellm`)."""
        if self._client is None:
            await load_litellm()
            self._client = LlmClient(self._settings)

    async def score_group(
        self, rubric: Rubric, prompt: str, shown: list[str], *, reference: str = "", relative: bool = False
    ) -> GroupScores:
        """Scores for ``shown`` (in order), or JudgeFailed after the last attempt."""
        await self.warm()
        assert self._client is not None
        messages = judge_messages(rubric, prompt, shown, reference=reference, relative=relative)
        ids = [label(i) for i in range(len(shown))]
        criteria = [c.name for c in rubric.criteria]
        last = "no attempt made"
        for attempt in range(1, self.config.attempts + 1):
            if attempt > 1:
                # Exponential backoff with jitter, so replicas that failed together do not retry together.
                delay = self.config.backoff_s * 2 ** (attempt - 2)
                await asyncio.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not crypto
            self.calls += 1
            try:
                completion = await asyncio.wait_for(
                    self._client.complete(messages, temperature=0.0, max_tokens=self.config.max_tokens),
                    self.config.timeout_s + 1.0,
                )
            except Exception as exc:  # noqa: BLE001 - any provider error or timeout: try again
                last = f"LLM call failed: {type(exc).__name__}: {str(exc)[:200]}"
                LLM_CALLS.labels("error").inc()
                log.warning("judge call failed", attempt=attempt, error=last)
                if getattr(exc, "status_code", None) in _NOT_RETRIED:
                    break  # the same request would be refused again: fall back now
                continue
            try:
                parsed = extract_json(completion.text)
                scores = read_scores(parsed.data, ids=ids, criteria=criteria)
            except MalformedAnswer as exc:
                last = f"malformed answer: {exc}"
                LLM_CALLS.labels("malformed").inc()
                log.warning("judge answer malformed", attempt=attempt, error=str(exc))
                continue
            LLM_CALLS.labels("repaired" if parsed.repaired else "ok").inc()
            return GroupScores([scores[i] for i in ids], attempts=attempt, repaired=parsed.repaired)
        raise JudgeFailed(f"{self.judge_id} failed {self.config.attempts} attempts; last: {last}")
