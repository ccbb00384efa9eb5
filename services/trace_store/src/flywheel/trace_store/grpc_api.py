"""gRPC servicer of the trace store: Ingest, GetTrace, QueryTraces, GetDecision,
ExportDataset and DeleteTraces."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import SpanStatus
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.core.validation import check_number, check_string, check_timestamp
from flywheel.trace_store import service
from flywheel.trace_store.exports import Exporter, ExportParams
from flywheel.trace_store.ingest import SpanWriter
from flywheel.trace_store.queries import TraceFilter, get_trace, query_traces
from flywheel.trace_store.retention import Eraser
from flywheel.trace_store.segments import SegmentStore
from flywheel.trace_store.spans import TRACE_ID, InvalidSpan, Limits, validate_batch


def trace_filter(request: pb.QueryTracesRequest, field: str = "") -> TraceFilter:
    """The query fields of a request as a filter, checked at the door (``field`` prefixes the
    names in errors, e.g. ``filter.text``)."""
    check_string(request.agent, f"{field}agent", max_len=64)
    check_string(request.endpoint, f"{field}endpoint", max_len=64)
    check_string(request.decision_id, f"{field}decision_id", max_len=64)
    check_string(request.text, f"{field}text", max_len=1024)
    check_string(request.page.page_token, f"{field}page.page_token", max_len=1024)
    return TraceFilter(
        agent=request.agent,
        start_after=check_timestamp(request.start_after, f"{field}start_after") or _at_epoch(request, "start_after"),
        start_before=check_timestamp(request.start_before, f"{field}start_before")
        or _at_epoch(request, "start_before"),
        endpoint=request.endpoint,
        decision_id=request.decision_id,
        min_reward=request.min_reward if request.HasField("min_reward") else None,
        max_reward=request.max_reward if request.HasField("max_reward") else None,
        text=request.text,
        status=request.status,
    )


def _at_epoch(request: pb.QueryTracesRequest, name: str) -> Any:
    """A timestamp set to the epoch itself (check_timestamp reads 0 as unset); None if unset."""
    return getattr(request, name).ToDatetime(tzinfo=UTC) if request.HasField(name) else None


def summary_message(row: Any) -> pb.TraceSummary:
    summary = pb.TraceSummary(
        trace_id=row.trace_id,
        agent=row.agent,
        span_count=row.span_count,
        decision_id=row.decision_id,
        endpoint=row.endpoint,
        task=row.task,
        user_id=row.user_id,
        status=SpanStatus.SPAN_STATUS_ERROR if row.error_count else SpanStatus.SPAN_STATUS_OK,
    )
    summary.start_time.FromDatetime(row.start_time)
    summary.end_time.FromDatetime(row.end_time)
    if row.reward is not None:
        summary.reward = row.reward
    return summary


def decision_message(row: Any, feedback: list[Any]) -> pb.DecisionRecord:
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
    return record


class TraceStoreServicer(pb_grpc.TraceStoreServiceServicer):
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        writer: SpanWriter,
        segments: SegmentStore,
        exporter: Exporter,
        eraser: Eraser,
        limits: Limits,
    ) -> None:
        self._sessions = sessions
        self._writer = writer
        self._segments = segments
        self._exporter = exporter
        self._eraser = eraser
        self._limits = limits

    async def Ingest(
        self, request_iterator: AsyncIterator[pb.IngestRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IngestResponse]:
        """Each request is answered once its spans are durable; an invalid batch ends the
        stream with INVALID_ARGUMENT (the batches answered before it are stored)."""
        async for request in request_iterator:
            spans = validate_batch(request.batch, limits=self._limits)
            (result,) = await self._writer.write([spans])
            if isinstance(result, InvalidSpan):
                raise result
            yield pb.IngestResponse(
                event_id=request.batch.meta.event_id, spans_stored=result.stored, spans_duplicate=result.duplicate
            )

    async def GetTrace(self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext) -> pb.GetTraceResponse:
        async with self._sessions() as session:
            summary, tree = await get_trace(session, self._segments, trace_id=request.trace_id)
            decision = None
            if summary.decision_id:
                with contextlib.suppress(NotFound):  # the decision event may not have arrived yet
                    decision = decision_message(*await service.get_decision(session, decision_id=summary.decision_id))
        return pb.GetTraceResponse(
            spans=[s for s, _ in tree], depths=[d for _, d in tree], trace=summary_message(summary), decision=decision
        )

    async def QueryTraces(
        self, request: pb.QueryTracesRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryTracesResponse:
        async with self._sessions() as session:
            rows, token = await query_traces(
                session,
                where=trace_filter(request),
                page_size=request.page.page_size,
                page_token=request.page.page_token,
            )
        return pb.QueryTracesResponse(traces=[summary_message(r) for r in rows], next_page_token=token)

    async def GetDecision(
        self, request: pb.GetDecisionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDecisionResponse:
        check_string(request.decision_id, "decision_id", max_len=64)
        async with self._sessions() as session:
            row, feedback = await service.get_decision(session, decision_id=request.decision_id)
        return pb.GetDecisionResponse(decision=decision_message(row, feedback))

    async def ExportDataset(
        self, request: pb.ExportDatasetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExportDatasetResponse:
        check_number(request.validation_fraction, "validation_fraction")
        check_number(request.min_reward, "min_reward")
        check_number(request.min_margin, "min_margin")
        params = ExportParams(
            kind=request.kind,
            validation_fraction=request.validation_fraction or 0.1,
            min_reward=request.min_reward or 0.8,
            min_margin=request.min_margin,
        )
        result = await self._exporter.export(where=trace_filter(request.filter, "filter."), params=params)
        return pb.ExportDatasetResponse(
            dataset_id=result.dataset_id,
            manifest_uri=result.manifest_uri,
            train_rows=result.train_rows,
            validation_rows=result.validation_rows,
            source_traces=result.source_traces,
        )

    async def DeleteTraces(
        self, request: pb.DeleteTracesRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTracesResponse:
        target = request.WhichOneof("target")
        if target == "trace_id":
            if not TRACE_ID.fullmatch(request.trace_id):
                raise InvalidArgument("trace_id must be 32 lowercase hex chars")
            deleted = await self._eraser.delete_traces([request.trace_id])
        elif target == "user_id" and request.user_id:
            check_string(request.user_id, "user_id", max_len=256)
            deleted = await self._eraser.delete_user(request.user_id)
        else:
            raise InvalidArgument("set trace_id or user_id")
        return pb.DeleteTracesResponse(traces_deleted=deleted.traces, spans_deleted=deleted.spans)
