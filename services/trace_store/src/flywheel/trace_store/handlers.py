"""Event handlers of the trace store: record decisions, feedback and span batches."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch, FeedbackEvent
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument
from flywheel.trace_store import service
from flywheel.trace_store.ingest import SpanWriter
from flywheel.trace_store.spans import InvalidSpan, Limits, validate_batch


def _time(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC) if ts.seconds or ts.nanos else datetime.now(UTC)


class DecisionBatchHandler:
    """Stores the valid decisions of a batch in one statement; if any is invalid (no id,
    endpoint or arm), the message is dead-lettered after them, with the reason."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, batch: DecisionBatch, delivery: Delivery) -> None:
        rows, invalid = [], []
        for i, event in enumerate(batch.decisions):
            if not event.decision_id or not event.endpoint or not event.arm_id:
                invalid.append(i)
                continue
            rows.append(
                {
                    "decision_id": event.decision_id,
                    "endpoint": event.endpoint,
                    "arm_id": event.arm_id,
                    "probability": event.probability,
                    "user_id": event.user_id,
                    "context": json_format.MessageToDict(event.context),
                    "decided_at": _time(event.meta.time),
                }
            )
        async with self._sessions() as session:
            await service.record_decisions(session, rows)
        if invalid:
            raise Reject(
                f"decisions {invalid} of the batch lack decision_id, endpoint or arm_id; the others were stored"
            )


class FeedbackHandler:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, event: FeedbackEvent, delivery: Delivery) -> None:
        try:
            async with self._sessions() as session:
                await service.record_feedback(
                    session,
                    event_id=event.meta.event_id,
                    decision_id=event.decision_id,
                    reward=event.reward if event.HasField("reward") else None,
                    signals=dict(event.signals),
                    sent_at=_time(event.meta.time),
                )
        except InvalidArgument as exc:
            raise Reject(str(exc)) from None


class SpanBatchHandler:
    """Stores every valid batch of a fetch in one durable write; an invalid batch (bad ids,
    unknown kind, parent cycle, oversized attributes...) is dead-lettered with the reason."""

    def __init__(self, writer: SpanWriter, limits: Limits) -> None:
        self._writer = writer
        self._limits = limits

    async def __call__(self, items: list[tuple[SpanBatch, Delivery]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(items)
        valid: list[tuple[int, list[Span]]] = []
        for i, (batch, delivery) in enumerate(items):
            agent = delivery.subject.rsplit(".", 1)[-1]  # flywheel.product.traces.<agent>
            try:
                valid.append((i, validate_batch(batch, default_agent=agent, limits=self._limits)))
            except InvalidSpan as exc:
                outcomes[i] = Reject(str(exc))
        if valid:
            results = await self._writer.write([spans for _, spans in valid])
            for (i, _), result in zip(valid, results, strict=True):
                if isinstance(result, InvalidSpan):
                    outcomes[i] = Reject(str(result))
        return outcomes
