"""Events the optimizer publishes."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import events_pb2
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.publisher import Publisher
from flywheel.optimizer.convert import struct
from flywheel.optimizer.service import Decision


class DecisionPublisher:
    """Publishes each decision on flywheel.optimizer.decision.<endpoint>."""

    def __init__(self, publisher: Publisher, catalogue: Catalogue) -> None:
        self._publisher = publisher
        self._catalogue = catalogue

    async def publish(self, decision: Decision, request: sel_pb.SelectRequest) -> None:
        now = Timestamp()
        now.GetCurrentTime()
        event = events_pb2.DecisionEvent(
            meta=EventMeta(event_id=decision.decision_id, time=now, source="optimizer"),
            decision_id=decision.decision_id,
            endpoint=decision.endpoint,
            arm_id=decision.arm_id,
            params=struct(decision.params),
            probability=decision.probability,
            user_id=request.user_id,
            context=request.context,
            session_id=request.session_id,
        )
        await self._publisher.publish(self._catalogue.decision(decision.endpoint), event)
