"""gRPC servicers of the optimizer: selection (hot path) and endpoint administration."""

from __future__ import annotations

import uuid
from datetime import timedelta

import grpc
import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.core.errors import InvalidArgument
from flywheel.optimizer import service
from flywheel.optimizer.convert import arm_spec, arm_stats, endpoint_message, endpoint_spec, from_struct, struct
from flywheel.optimizer.events import DecisionPublisher


class SelectionServicer(sel_grpc.SelectionServiceServicer):
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], decisions: DecisionPublisher, feedback_window: timedelta
    ) -> None:
        self._sessions = sessions
        self._decisions = decisions
        self._window = feedback_window
        self._rng = np.random.default_rng()

    async def _select_one(self, request: sel_pb.SelectRequest) -> sel_pb.SelectResponse:
        context = from_struct(request.context)
        async with self._sessions() as session:
            decision = await service.select(
                session,
                endpoint=request.endpoint,
                user_id=request.user_id,
                session_id=request.session_id,
                context=context,
                rng=self._rng,
            )
        await self._decisions.publish(decision, request)
        return sel_pb.SelectResponse(
            decision_id=decision.decision_id,
            arm_id=decision.arm_id,
            params=struct(decision.params),
            probability=decision.probability,
        )

    async def Select(self, request: sel_pb.SelectRequest, context: grpc.aio.ServicerContext) -> sel_pb.SelectResponse:
        return await self._select_one(request)

    async def SelectBatch(
        self, request: sel_pb.SelectBatchRequest, context: grpc.aio.ServicerContext
    ) -> sel_pb.SelectBatchResponse:
        if not request.requests:
            raise InvalidArgument("SelectBatch needs at least one request")
        return sel_pb.SelectBatchResponse(decisions=[await self._select_one(r) for r in request.requests])

    async def Update(self, request: sel_pb.UpdateRequest, context: grpc.aio.ServicerContext) -> sel_pb.UpdateResponse:
        async with self._sessions() as session:
            outcome = await service.apply_feedback(
                session,
                event_id=request.feedback_id or f"rpc-{uuid.uuid4().hex}",
                decision_id=request.decision_id,
                reward=request.reward if request.HasField("reward") else None,
                signals=dict(request.signals),
                window=self._window,
            )
        return sel_pb.UpdateResponse(applied=outcome.applied, stats=arm_stats(outcome.arm))


class EndpointAdminServicer(admin_grpc.EndpointAdminServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def _endpoint(self, session: AsyncSession, name: str) -> admin_pb.GetEndpointResponse:
        row, arms = await service.get_endpoint(session, name=name)
        return admin_pb.GetEndpointResponse(endpoint=endpoint_message(row, arms))

    async def CreateEndpoint(
        self, request: admin_pb.CreateEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.CreateEndpointResponse:
        async with self._sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(request.endpoint))
            got = await self._endpoint(session, request.endpoint.name)
        return admin_pb.CreateEndpointResponse(endpoint=got.endpoint)

    async def GetEndpoint(
        self, request: admin_pb.GetEndpointRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetEndpointResponse:
        async with self._sessions() as session:
            return await self._endpoint(session, request.name)

    async def ListEndpoints(
        self, request: admin_pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListEndpointsResponse:
        async with self._sessions() as session:
            found = await service.list_endpoints(session)
        return admin_pb.ListEndpointsResponse(endpoints=[endpoint_message(r, a) for r, a in found])

    async def AddArm(
        self, request: admin_pb.AddArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.AddArmResponse:
        async with self._sessions() as session:
            await service.add_arm(session, endpoint=request.endpoint, arm=arm_spec(request.arm))
            got = await self._endpoint(session, request.endpoint)
        return admin_pb.AddArmResponse(endpoint=got.endpoint)

    async def RetireArm(
        self, request: admin_pb.RetireArmRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.RetireArmResponse:
        async with self._sessions() as session:
            await service.retire_arm(session, endpoint=request.endpoint, arm_id=request.arm_id)
            got = await self._endpoint(session, request.endpoint)
        return admin_pb.RetireArmResponse(endpoint=got.endpoint)
