"""A small client of the reward judge (``RewardJudgeService``): ``Score`` one response, or
``Rank`` a group of responses to the same prompt. Shared by the evaluator (llm_judge and
embedding metrics) and the trainer (judge rewards for GRPO/RLOO).

When no judge address is configured, or the judge stays unreachable through its retries,
:class:`JudgeUnavailable` says so plainly; each caller decides what a missing judgement
means (the evaluator leaves the metric out, the trainer leaves the reward out), never a zero."""

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
    """Calls ``RewardJudgeService.Score`` and ``Rank`` with a timeout, retrying transient
    failures.

    With ``tls`` the channel is TLS (mTLS when it holds a client certificate); whether a
    token may travel without it is decided by the caller's settings. ``address_setting`` is
    the name of the setting that holds the address, quoted when none is configured.

    ``wait_for_ready``: a call made while the judge is down (restarting, or killed with the
    call in flight) waits up to ``timeout_s`` for it to come back instead of failing within
    the retries' 1.2 s; for callers in no hurry (the society's SAO rounds), not for the
    evaluator or a trainer's reward, which leave a missing judgement out at once."""

    def __init__(
        self,
        address: str,
        *,
        auth_token: str | None = None,
        tls: ClientTls | None = None,
        timeout_s: float = 30.0,
        attempts: int = 3,
        address_setting: str = "the reward judge address",
        wait_for_ready: bool = False,
    ) -> None:
        self.address = address
        self._tls = tls
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._address_setting = address_setting
        self._wait_for_ready = wait_for_ready
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.RewardJudgeServiceStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ready(self) -> pb_grpc.RewardJudgeServiceStub:
        if not self.address:
            raise JudgeUnavailable(f"no reward judge configured (set {self._address_setting})")
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            # A grpc.aio channel belongs to the loop it was made on; a trainer's reward runs on
            # the event loop of its own TRL trainer, so a client outliving one run reconnects.
            self._channel = aio_channel(self.address, self._tls)
            self._stub = pb_grpc.RewardJudgeServiceStub(self._channel)
            self._loop = loop
        return self._stub

    async def _call(self, method: str, request: object) -> object:
        stub = self._ready()
        for attempt in range(1, self._attempts + 1):
            try:
                return await getattr(stub, method)(
                    request, timeout=self._timeout_s, metadata=self._metadata, wait_for_ready=self._wait_for_ready
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSIENT and attempt < self._attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise JudgeUnavailable(f"reward judge at {self.address}: {exc.code().name}: {exc.details()}") from None
        raise AssertionError("unreachable")

    async def score(
        self, *, prompt: str, response: str, rubric: str, reference: str, judge: int = pb.JUDGE_KIND_UNSPECIFIED
    ) -> JudgeScore:
        """Score one response (``judge``: UNSPECIFIED is the LLM judge with its fallback;
        JUDGE_KIND_EMBEDDING is embedding similarity to ``reference``)."""
        request = pb.ScoreRequest(
            prompt=prompt,
            response=response,
            rubric=rubric,
            reference=reference,
            judge=judge,  # type: ignore[arg-type]
        )
        got: pb.ScoreResponse = await self._call("Score", request)  # type: ignore[assignment]
        return _judge_score(got.judgement)

    async def rank(
        self, prompt: str, responses: list[str], rubric: str = "", *, judge: int = pb.JUDGE_KIND_UNSPECIFIED
    ) -> list[float]:
        """Relative scores in [0, 1] for ``responses`` to the same ``prompt``, in request order
        (the judge sees the group together, in two presentation orders). At least two."""
        if len(responses) < 2:
            raise ValueError(f"rank: needs at least two responses, got {len(responses)}")
        request = pb.RankRequest(prompt=prompt, responses=list(responses), rubric=rubric, judge=judge)  # type: ignore[arg-type]
        got: pb.RankResponse = await self._call("Rank", request)  # type: ignore[assignment]
        if len(got.judgements) != len(responses):
            raise JudgeUnavailable(
                f"reward judge at {self.address}: Rank answered {len(got.judgements)} judgements"
                f" for {len(responses)} responses"
            )
        return [_judge_score(j).score for j in got.judgements]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None


def _judge_score(j: pb.Judgement) -> JudgeScore:
    return JudgeScore(
        score=min(1.0, max(0.0, j.score)),
        judge_id=j.judge_id or pb.JudgeKind.Name(j.judge),
        fallback_reason=j.fallback_reason if j.fallback_used else "",
        explanation=j.explanation,
    )
