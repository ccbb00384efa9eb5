"""Event handlers of the trace store: record decisions, feedback and span batches."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch, DecisionEvent, FeedbackEvent
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import check_number, check_numbers, check_string, check_timestamp, struct_to_dict
from flywheel.trace_store import service
from flywheel.trace_store.ingest import SpanWriter
from flywheel.trace_store.spans import InvalidSpan, Limits, validate_batch

# Column widths of decision_log and feedback_log (migrations/versions/0001_initial.py).
DECISION_ID_CHARS = ENDPOINT_CHARS = 64
ARM_ID_CHARS = EVENT_ID_CHARS = 128
USER_ID_CHARS = 256
MAX_CONTEXT_BYTES = 256 * 1024


def _time(ts: Timestamp, field: str) -> datetime:
    """The event's time (now when unset); raises Invalid when it is out of range."""
    return check_timestamp(ts, field) or datetime.now(UTC)


def decision_row(event: DecisionEvent) -> dict[str, object]:
    """A decision_log row from an event, every field checked (raises Invalid naming it)."""
    if not event.decision_id or not event.endpoint or not event.arm_id:
        raise InvalidArgument("lacks decision_id, endpoint or arm_id")
    check_string(event.decision_id, "decision_id", max_len=DECISION_ID_CHARS)
    check_string(event.endpoint, "endpoint", max_len=ENDPOINT_CHARS)
    check_string(event.arm_id, "arm_id", max_len=ARM_ID_CHARS)
    check_string(event.user_id, "user_id", max_len=USER_ID_CHARS)
    check_number(event.probability, "probability", min_value=0.0, min_exclusive=True, max_value=1.0)
    return {
        "decision_id": event.decision_id,
        "endpoint": event.endpoint,
        "arm_id": event.arm_id,
        "probability": event.probability,
        "user_id": event.user_id,
        "context": struct_to_dict(event.context, "context", max_bytes=MAX_CONTEXT_BYTES),
        "decided_at": _time(event.meta.time, "meta.time"),
    }


class DecisionBatchHandler:
    """Stores the valid decisions of a batch in one statement; if any is invalid (no id,
    endpoint or arm), the message is dead-lettered after them, with the reason."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, batch: DecisionBatch, delivery: Delivery) -> None:
        try:
            check_timestamp(batch.meta.time, "meta.time")
            check_string(batch.meta.event_id, "meta.event_id", max_len=EVENT_ID_CHARS)
        except InvalidArgument as exc:
            raise Reject(f"the batch: {exc}") from None
        rows, invalid, reasons = [], [], []
        for i, event in enumerate(batch.decisions):
            try:
                rows.append(decision_row(event))
            except InvalidArgument as exc:
                invalid.append(i)
                reasons.append(f"decisions[{i}] {event.decision_id[:64]!r}: {exc}")
        async with self._sessions() as session:
            await service.record_decisions(session, rows)
        if invalid:
            raise Reject(f"decisions {invalid[:20]} of the batch are invalid (the others were stored): {reasons[:10]}")


class FeedbackHandler:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, event: FeedbackEvent, delivery: Delivery) -> None:
        try:
            check_string(event.meta.event_id, "meta.event_id", max_len=EVENT_ID_CHARS)
            check_string(event.decision_id, "decision_id", max_len=DECISION_ID_CHARS)
            check_numbers(event.signals, "signals")
            if event.HasField("reward"):
                check_number(event.reward, "reward")
            sent_at = _time(event.meta.time, "meta.time")
            async with self._sessions() as session:
                await service.record_feedback(
                    session,
                    event_id=event.meta.event_id,
                    decision_id=event.decision_id,
                    reward=event.reward if event.HasField("reward") else None,
                    signals=dict(event.signals),
                    sent_at=sent_at,
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
