"""A small client of the reward judge's ``Score`` for llm_judge metrics (and embedding
similarity, which the judge computes with the model it already holds).

When no judge address is configured, or the judge stays unreachable through its
retries, :class:`JudgeUnavailable` says so plainly; the evaluator then leaves llm_judge
out of the score (a missing metric is not a zero) and reports why in metric_errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.api.tls import ClientTls, aio_channel

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class JudgeUnavailable(Exception):
    """The judge could not score (not configured, unreachable, or it refused the request)."""


@dataclass(frozen=True)
class JudgeScore:
    score: float
    judge_id: str
    fallback_reason: str
    explanation: str


class JudgeClient:
    """Calls ``RewardJudgeService.Score`` with a timeout, retrying transient failures.

    With ``tls`` the channel is TLS (mTLS when it holds a client certificate); whether a
    token may travel without it is decided by the settings (``EvaluatorSettings``)."""

    def __init__(
        self,
        address: str,
        *,
        auth_token: str | None = None,
        tls: ClientTls | None = None,
        timeout_s: float = 30.0,
        attempts: int = 3,
    ) -> None:
        self.address = address
        self._tls = tls
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.RewardJudgeServiceStub | None = None

    async def score(
        self, *, prompt: str, response: str, rubric: str, reference: str, judge: int = pb.JUDGE_KIND_UNSPECIFIED
    ) -> JudgeScore:
        """Score one response (``judge``: UNSPECIFIED is the LLM judge with its fallback;
        JUDGE_KIND_EMBEDDING is embedding similarity to ``reference``)."""
        if not self.address:
            raise JudgeUnavailable("no reward judge configured (set FLYWHEEL_EVALUATOR_JUDGE_ADDRESS)")
        if self._stub is None:
            self._channel = aio_channel(self.address, self._tls)
            self._stub = pb_grpc.RewardJudgeServiceStub(self._channel)
        request = pb.ScoreRequest(
            prompt=prompt,
            response=response,
            rubric=rubric,
            reference=reference,
            judge=judge,  # type: ignore[arg-type]
        )
        for attempt in range(1, self._attempts + 1):
            try:
                got = await self._stub.Score(request, timeout=self._timeout_s, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSIENT and attempt < self._attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise JudgeUnavailable(f"reward judge at {self.address}: {exc.code().name}: {exc.details()}") from None
            j = got.judgement
            return JudgeScore(
                score=min(1.0, max(0.0, j.score)),
                judge_id=j.judge_id or pb.JudgeKind.Name(j.judge),
                fallback_reason=j.fallback_reason if j.fallback_used else "",
                explanation=j.explanation,
            )
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
