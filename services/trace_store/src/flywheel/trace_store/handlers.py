"""Event handlers of the trace store: record decisions and feedback."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1.events_pb2 import DecisionEvent, FeedbackEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import InvalidArgument
from flywheel.trace_store import service


def _time(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC) if ts.seconds or ts.nanos else datetime.now(UTC)


class DecisionHandler:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, event: DecisionEvent, delivery: Delivery) -> None:
        try:
            async with self._sessions() as session:
                await service.record_decision(
                    session,
                    decision_id=event.decision_id,
                    endpoint=event.endpoint,
                    arm_id=event.arm_id,
                    probability=event.probability,
                    user_id=event.user_id,
                    context=json_format.MessageToDict(event.context),
                    decided_at=_time(event.meta.time),
                )
        except InvalidArgument as exc:
            raise Reject(str(exc)) from None


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
