"""gRPC servicers of the optimizer: selection (hot path), endpoint administration and
off-policy evaluation. Each method validates, calls the domain layer, converts."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2_grpc as ope_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from flywheel.core.validation import (
    Invalid,
    check_number,
    check_numbers,
    check_string,
    check_timestamp,
    struct_to_dict,
)
from flywheel.optimizer import ope_service, service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import arm_spec, arm_stats, endpoint_message, endpoint_spec, struct
from flywheel.optimizer.decisions import Decision, DecisionLog
from flywheel.optimizer.feedback_batcher import FeedbackBatcher
from flywheel.optimizer.ope_service import Candidate
from flywheel.optimizer.selector import Selector
from flywheel.optimizer.service import FeedbackItem
from flywheel.optimizer.spec import ENDPOINT_NAME, RETIRED

MAX_BATCH = 1000
# Serialized size of a Select's context. Every decision event carries its context and its arm's
# params (at most spec.MAX_PARAMS_BYTES), so one decision always fits NATS's default max_payload
# (1 MiB; decisions.MAX_MESSAGE_BYTES is 900 KiB) and the decision log never holds an event the
# bus refuses.
MAX_CONTEXT_BYTES = 64 * 1024
# Column widths of the decision log (migrations/versions/0001_initial.py).
USER_ID_CHARS = SESSION_ID_CHARS = 256
# A worker thread of the sync server waits at most this long for a Select it handed to the loop.
SELECT_ON_LOOP_TIMEOUT_S = 30.0


def _select_args(r: sel_pb.SelectRequest, field: str = "") -> dict[str, Any]:
    """Selector keyword arguments from a request (its context both as a dict and as the Struct),
    refusing at the door what the decision log could not store or the bus could not carry."""
    has_context = r.HasField("context")
    check_string(r.endpoint, f"{field}endpoint", max_len=service.ENDPOINT_CHARS)
    check_string(r.user_id, f"{field}user_id", max_len=USER_ID_CHARS)
    check_string(r.session_id, f"{field}session_id", max_len=SESSION_ID_CHARS)
    return {
        "endpoint": r.endpoint,
        "user_id": r.user_id,
        "session_id": r.session_id,
        "context": struct_to_dict(r.context, f"{field}context", max_bytes=MAX_CONTEXT_BYTES) if has_context else {},
        "context_struct": r.context if has_context else None,
    }


def _batch_args(request: sel_pb.SelectBatchRequest) -> list[dict[str, Any]]:
    """Every request of a batch checked before any decision is made: a bad one refuses the call."""
    if not request.requests:
        raise InvalidArgument("SelectBatch needs at least one request")
    if len(request.requests) > MAX_BATCH:
        raise InvalidArgument(f"SelectBatch takes at most {MAX_BATCH} requests, got {len(request.requests)}")
    return [_select_args(r, f"requests[{i}].") for i, r in enumerate(request.requests)]


def _feedback_item(request: sel_pb.UpdateRequest) -> FeedbackItem:
    check_string(request.feedback_id, "feedback_id", max_len=service.EVENT_ID_CHARS)
    check_string(request.decision_id, "decision_id", max_len=service.DECISION_ID_CHARS, required=True)
    check_numbers(request.signals, "signals")
    if request.HasField("reward"):
        check_number(request.reward, "reward")
    return FeedbackItem(
        event_id=request.feedback_id or f"rpc-{uuid.uuid4().hex}",
        decision_id=request.decision_id,
        reward=request.reward if request.HasField("reward") else None,
        signals=dict(request.signals),
    )


def _name(value: str, field: str) -> str:
    """An endpoint name from a request: one that CreateEndpoint could have accepted (a NATS
    subject token), so a lookup of a name that cannot exist is told why, not NOT_FOUND."""
    check_string(value, field, max_len=service.ENDPOINT_CHARS, required=True, what="the endpoint's name")
    if not ENDPOINT_NAME.fullmatch(value):
        raise Invalid(field, "must be 1-64 characters of [A-Za-z0-9_-] (an endpoint's name is a NATS subject token)")
    return value


def _before_deadline(context: grpc.ServicerContext) -> float | None:
    """Seconds a call may still wait for room in the decision log: its time left less 50 ms for
    the answer to travel (None: the call has no deadline)."""
    left = context.time_remaining()
    return None if left is None else max(0.0, left - 0.05)


def _response(d: Decision) -> sel_pb.SelectResponse:
    params = d.params_struct if d.params_struct is not None else struct(d.params)
    return sel_pb.SelectResponse(decision_id=d.decision_id, arm_id=d.arm_id, params=params, probability=d.probability)


class SelectionServicer(sel_grpc.SelectionServiceServicer):
    def __init__(
        self,
        selector: Selector,
        sessions: async_sessionmaker[AsyncSession],
        log: DecisionLog,
        cache: PosteriorCache,
        feedback_window: timedelta,
        *,
        fold: bool = True,
    ) -> None:
        self._selector = selector
        self._log = log
        self._cache = cache
        # Each batch's increments are folded into the cache right after its commit.
        self._fold = fold
        self._feedback = FeedbackBatcher(sessions, feedback_window, folds=cache if fold else None)
        self._loop = asyncio.get_running_loop()

    def _select_sync(self, args: dict[str, Any]) -> Decision:
        """For the sync server's worker threads: decide here when no await is needed, else on the loop."""
        decision = self._selector.select_now(**args)
        if decision is None:
            future = asyncio.run_coroutine_threadsafe(self._selector.select(**args), self._loop)
            try:
                decision = future.result(timeout=SELECT_ON_LOOP_TIMEOUT_S)
            except TimeoutError:
                future.cancel()
                raise DeadlineExceeded(f"Select did not finish within {SELECT_ON_LOOP_TIMEOUT_S:g}s") from None
        return decision

    def Select_sync(self, request: sel_pb.SelectRequest, context: grpc.ServicerContext) -> sel_pb.SelectResponse:
        decision = self._select_sync({**_select_args(request), "record": False})
        # At the log's bound a worker waits for room, but not past its caller's deadline.
        self._log.record_many([decision], wait_s=_before_deadline(context))
        return _response(decision)

    def SelectBatch_sync(
        self, request: sel_pb.SelectBatchRequest, context: grpc.ServicerContext
    ) -> sel_pb.SelectBatchResponse:
        decisions = [self._select_sync({**a, "record": False}) for a in _batch_args(request)]
        # All or none: a refused call leaves no decision logged.
        self._log.record_many(decisions, wait_s=_before_deadline(context))
        return sel_pb.SelectBatchResponse(decisions=[_response(d) for d in decisions])

    async def Select(self, request: sel_pb.SelectRequest, context: grpc.aio.ServicerContext) -> sel_pb.SelectResponse:
        return _response(await self._selector.select(**_select_args(request)))

    async def SelectBatch(
        self, request: sel_pb.SelectBatchRequest, context: grpc.aio.ServicerContext
    ) -> sel_pb.SelectBatchResponse:
        decisions = [await self._selector.select(**a, record=False) for a in _batch_args(request)]
        self._log.record_many(decisions)  # all or none: a refused call leaves no decision logged
        return sel_pb.SelectBatchResponse(decisions=[_response(d) for d in decisions])

    async def Update(self, request: sel_pb.UpdateRequest, context: grpc.aio.ServicerContext) -> sel_pb.UpdateResponse:
        item = _feedback_item(request)
        try:
            outcome, committed = await self._feedback.apply(item)
        except Unavailable:
            await self._log.flush()  # the decision may still be in this replica's buffer
            outcome, committed = await self._feedback.apply(item)
        # The cached snapshot once the batch's fold is built into it: the stats reported are
        # those the next Select samples from. (Not cached here, or its rebuild failed: every
        # caller of one batch has the same commit time, so they share one reload.)
        snap = await self._cache.caught_up(outcome.endpoint) if self._fold else None
        if snap is None or outcome.arm_id not in snap.arm_ids:  # an arm added since its read
            snap = await self._cache.fresh(outcome.endpoint, since=committed)
        return sel_pb.UpdateResponse(applied=outcome.applied, stats=arm_stats(snap, snap.arm_ids.index(outcome.arm_id)))


class EndpointAdminServicer(admin_grpc.EndpointAdminServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], cache: PosteriorCache) -> None:
        self._sessions = sessions
        self._cache = cache

    async def CreateEndpoint(
        self, request: admin_pb.CreateEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.CreateEndpointResponse:
        async with self._sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(request.endpoint))
        snap = await self._cache.changed(request.endpoint.name)
        return admin_pb.CreateEndpointResponse(endpoint=endpoint_message(snap))

    async def GetEndpoint(
        self, request: admin_pb.GetEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetEndpointResponse:
        # A fresh read for the caller: what Select samples from is left as it is.
        snap = await self._cache.read(_name(request.name, "name"))
        return admin_pb.GetEndpointResponse(endpoint=endpoint_message(snap))

    async def ListEndpoints(
        self, request: admin_pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListEndpointsResponse:
        snaps = await self._cache.read_all()  # a fresh read; Select's snapshots are left as they are
        return admin_pb.ListEndpointsResponse(endpoints=[endpoint_message(s) for s in snaps])

    async def UpdateEndpoint(
        self, request: admin_pb.UpdateEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.UpdateEndpointResponse:
        async with self._sessions() as session:
            await service.update_endpoint(session, spec=endpoint_spec(request.endpoint))
        snap = await self._cache.changed(request.endpoint.name)
        return admin_pb.UpdateEndpointResponse(endpoint=endpoint_message(snap))

    async def AddArm(
        self, request: admin_pb.AddArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AddArmResponse:
        async with self._sessions() as session:
            arm = arm_spec(request.arm, "arm")
            await service.add_arm(session, endpoint=_name(request.endpoint, "endpoint"), arm=arm)
        return admin_pb.AddArmResponse(endpoint=endpoint_message(await self._cache.changed(request.endpoint)))

    async def RetireArm(
        self, request: admin_pb.RetireArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.RetireArmResponse:
        _name(request.endpoint, "endpoint")
        check_string(request.arm_id, "arm_id", max_len=128, required=True)
        async with self._sessions() as session:
            await service.set_arm_status(session, endpoint=request.endpoint, arm_id=request.arm_id, status=RETIRED)
            await session.commit()
        return admin_pb.RetireArmResponse(endpoint=endpoint_message(await self._cache.changed(request.endpoint)))


_ESTIMATORS = {"ips": ope_pb.ESTIMATOR_IPS, "snips": ope_pb.ESTIMATOR_SNIPS, "dr": ope_pb.ESTIMATOR_DOUBLY_ROBUST}


class OffPolicyServicer(ope_grpc.OffPolicyServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], cache: PosteriorCache) -> None:
        self._sessions = sessions
        self._cache = cache

    async def EstimatePolicyValue(
        self, request: ope_pb.EstimatePolicyValueRequest, context: grpc.aio.ServicerContext
    ) -> ope_pb.EstimatePolicyValueResponse:
        _name(request.endpoint, "endpoint")
        which = request.candidate.WhichOneof("kind")
        if which == "arm_id":
            check_string(request.candidate.arm_id, "candidate.arm_id", max_len=128)
        elif which == "distribution":
            check_numbers(request.candidate.distribution.probabilities, "candidate.distribution.probabilities")
        since = check_timestamp(request.since, "since") if request.HasField("since") else None
        until = check_timestamp(request.until, "until") if request.HasField("until") else None
        check_number(request.confidence, "confidence")
        candidate = Candidate(
            arm_id=request.candidate.arm_id if which == "arm_id" else "",
            distribution=dict(request.candidate.distribution.probabilities) if which == "distribution" else None,
            current_posterior=which == "current_posterior" and request.candidate.current_posterior,
        )
        snap = await self._cache.read(request.endpoint)  # a fresh read; Select's snapshot is left as it is
        async with self._sessions() as session:
            result = await ope_service.estimate(
                session,
                snap=snap,
                candidate=candidate,
                since=since,
                until=until,
                confidence=request.confidence or 0.95,
            )
        return ope_pb.EstimatePolicyValueResponse(
            estimates=[
                ope_pb.PolicyValueEstimate(
                    estimator=_ESTIMATORS[e.estimator], value=e.value, ci_low=e.ci_low, ci_high=e.ci_high
                )
                for e in result.estimates
            ],
            samples=result.samples,
            logged_value=result.logged_value,
            effective_sample_size=result.effective_sample_size,
        )
