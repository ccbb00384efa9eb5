"""gRPC servicer of the trace store. Ingest, GetTrace, QueryTraces and ExportDataset
are part of the trace-store issue and answer UNIMPLEMENTED until then."""

from __future__ import annotations

import grpc
from google.protobuf.struct_pb2 import Struct
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.trace_store import service


class TraceStoreServicer(pb_grpc.TraceStoreServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def GetDecision(
        self, request: pb.GetDecisionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDecisionResponse:
        async with self._sessions() as session:
            row, feedback = await service.get_decision(session, decision_id=request.decision_id)
        ctx = Struct()
        ctx.update(row.context)
        record = pb.DecisionRecord(
            decision_id=row.decision_id,
            endpoint=row.endpoint,
            arm_id=row.arm_id,
            probability=row.probability,
            user_id=row.user_id,
            context=ctx,
        )
        record.time.FromDatetime(row.decided_at)
        for f in feedback:
            item = record.feedback.add(event_id=f.event_id, signals=f.signals)
            if f.reward is not None:
                item.reward = f.reward
            item.time.FromDatetime(f.sent_at)
        return pb.GetDecisionResponse(decision=record)
