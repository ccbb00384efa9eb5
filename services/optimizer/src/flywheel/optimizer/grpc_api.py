"""gRPC servicers of the optimizer: selection (hot path), endpoint administration and
off-policy evaluation. Each method validates, calls the domain layer, converts."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, timedelta
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2_grpc as ope_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.core.errors import InvalidArgument, Unavailable
from flywheel.optimizer import ope_service, service
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.convert import arm_spec, arm_stats, endpoint_message, endpoint_spec, from_struct, struct
from flywheel.optimizer.decisions import Decision, DecisionLog
from flywheel.optimizer.feedback_batcher import FeedbackBatcher
from flywheel.optimizer.ope_service import Candidate
from flywheel.optimizer.selector import Selector
from flywheel.optimizer.service import FeedbackItem
from flywheel.optimizer.spec import RETIRED

MAX_BATCH = 1000


def _select_args(r: sel_pb.SelectRequest) -> dict[str, Any]:
    """Selector keyword arguments from a request (its context both as a dict and as the Struct)."""
    has_context = r.HasField("context")
    return {
        "endpoint": r.endpoint,
        "user_id": r.user_id,
        "session_id": r.session_id,
        "context": from_struct(r.context) if has_context else {},
        "context_struct": r.context if has_context else None,
    }


def _check_batch(request: sel_pb.SelectBatchRequest) -> None:
    if not request.requests:
        raise InvalidArgument("SelectBatch needs at least one request")
    if len(request.requests) > MAX_BATCH:
        raise InvalidArgument(f"SelectBatch takes at most {MAX_BATCH} requests, got {len(request.requests)}")


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
    ) -> None:
        self._selector = selector
        self._log = log
        self._cache = cache
        self._feedback = FeedbackBatcher(sessions, feedback_window)
        self._loop = asyncio.get_running_loop()

    def _select_sync(self, r: sel_pb.SelectRequest) -> Decision:
        """For the sync server's worker threads: decide here when no await is needed, else on the loop."""
        args = _select_args(r)
        decision = self._selector.select_now(**args)
        if decision is None:
            decision = asyncio.run_coroutine_threadsafe(self._selector.select(**args), self._loop).result()
        return decision

    def Select_sync(self, request: sel_pb.SelectRequest, context: grpc.ServicerContext) -> sel_pb.SelectResponse:
        return _response(self._select_sync(request))

    def SelectBatch_sync(
        self, request: sel_pb.SelectBatchRequest, context: grpc.ServicerContext
    ) -> sel_pb.SelectBatchResponse:
        _check_batch(request)
        return sel_pb.SelectBatchResponse(decisions=[_response(self._select_sync(r)) for r in request.requests])

    async def _select(self, r: sel_pb.SelectRequest) -> Decision:
        return await self._selector.select(**_select_args(r))

    async def Select(self, request: sel_pb.SelectRequest, context: grpc.aio.ServicerContext) -> sel_pb.SelectResponse:
        return _response(await self._select(request))

    async def SelectBatch(
        self, request: sel_pb.SelectBatchRequest, context: grpc.aio.ServicerContext
    ) -> sel_pb.SelectBatchResponse:
        _check_batch(request)
        return sel_pb.SelectBatchResponse(decisions=[_response(await self._select(r)) for r in request.requests])

    async def Update(self, request: sel_pb.UpdateRequest, context: grpc.aio.ServicerContext) -> sel_pb.UpdateResponse:
        item = FeedbackItem(
            event_id=request.feedback_id or f"rpc-{uuid.uuid4().hex}",
            decision_id=request.decision_id,
            reward=request.reward if request.HasField("reward") else None,
            signals=dict(request.signals),
        )
        try:
            outcome, committed = await self._feedback.apply(item)
        except Unavailable:
            await self._log.flush()  # the decision may still be in this replica's buffer
            outcome, committed = await self._feedback.apply(item)
        # Every caller of one batch has the same commit time, so they share one reload.
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
        return admin_pb.CreateEndpointResponse(endpoint=endpoint_message(await self._cache.load(request.endpoint.name)))

    async def GetEndpoint(
        self, request: admin_pb.GetEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetEndpointResponse:
        if not request.name:
            raise InvalidArgument("endpoint name is empty")
        return admin_pb.GetEndpointResponse(endpoint=endpoint_message(await self._cache.load(request.name)))

    async def ListEndpoints(
        self, request: admin_pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListEndpointsResponse:
        async with self._sessions() as session:
            names = await service.endpoint_names(session)
        return admin_pb.ListEndpointsResponse(endpoints=[endpoint_message(await self._cache.load(n)) for n in names])

    async def UpdateEndpoint(
        self, request: admin_pb.UpdateEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.UpdateEndpointResponse:
        async with self._sessions() as session:
            await service.update_endpoint(session, spec=endpoint_spec(request.endpoint))
        snap = await self._cache.load(request.endpoint.name)
        return admin_pb.UpdateEndpointResponse(endpoint=endpoint_message(snap))

    async def AddArm(
        self, request: admin_pb.AddArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AddArmResponse:
        async with self._sessions() as session:
            await service.add_arm(session, endpoint=request.endpoint, arm=arm_spec(request.arm))
        return admin_pb.AddArmResponse(endpoint=endpoint_message(await self._cache.load(request.endpoint)))

    async def RetireArm(
        self, request: admin_pb.RetireArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.RetireArmResponse:
        async with self._sessions() as session:
            await service.set_arm_status(session, endpoint=request.endpoint, arm_id=request.arm_id, status=RETIRED)
            await session.commit()
        return admin_pb.RetireArmResponse(endpoint=endpoint_message(await self._cache.load(request.endpoint)))


_ESTIMATORS = {"ips": ope_pb.ESTIMATOR_IPS, "snips": ope_pb.ESTIMATOR_SNIPS, "dr": ope_pb.ESTIMATOR_DOUBLY_ROBUST}


class OffPolicyServicer(ope_grpc.OffPolicyServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], cache: PosteriorCache) -> None:
        self._sessions = sessions
        self._cache = cache

    async def EstimatePolicyValue(
        self, request: ope_pb.EstimatePolicyValueRequest, context: grpc.aio.ServicerContext
    ) -> ope_pb.EstimatePolicyValueResponse:
        if not request.endpoint:
            raise InvalidArgument("endpoint name is empty")
        which = request.candidate.WhichOneof("kind")
        candidate = Candidate(
            arm_id=request.candidate.arm_id if which == "arm_id" else "",
            distribution=dict(request.candidate.distribution.probabilities) if which == "distribution" else None,
            current_posterior=which == "current_posterior" and request.candidate.current_posterior,
        )
        snap = await self._cache.load(request.endpoint)
        async with self._sessions() as session:
            result = await ope_service.estimate(
                session,
                snap=snap,
                candidate=candidate,
                since=request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None,
                until=request.until.ToDatetime(tzinfo=UTC) if request.HasField("until") else None,
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
