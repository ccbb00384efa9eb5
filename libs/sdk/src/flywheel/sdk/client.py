"""The product-side client: ``select`` over gRPC, ``feedback`` over NATS JetStream.

    async with FlywheelClient(target="127.0.0.1:50051", nats_url="nats://127.0.0.1:4222") as fw:
        d = await fw.select("support-bot", user_id="u1")
        ...  # use d.params
        await fw.feedback(d, reward=1.0)

Feedback is published with a fresh event id that is also JetStream's dedup id, so a
retried publish is stored once and the optimizer applies it once.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
import nats
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct
from nats.aio.client import Client as Nats

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.optimizer.v1.selection_service_pb2_grpc import SelectionServiceStub
from flywheel.api.subjects import Catalogue


@dataclass(frozen=True)
class Decision:
    """The arm chosen for one request; keep ``decision_id`` to report feedback."""

    decision_id: str
    endpoint: str
    arm_id: str
    params: dict[str, Any]
    probability: float


class FlywheelClient:
    """Async client for products. Credentials and TLS are arguments, never logged."""

    def __init__(
        self,
        *,
        target: str,
        nats_url: str | None = None,
        nats_user: str | None = None,
        nats_password: str | None = None,
        namespace: str = "flywheel",
        auth_token: str | None = None,
        tls_root_certificates: bytes | None = None,
        source: str = "sdk",
    ) -> None:
        creds = grpc.ssl_channel_credentials(tls_root_certificates) if tls_root_certificates else None
        self._channel = grpc.aio.secure_channel(target, creds) if creds else grpc.aio.insecure_channel(target)
        self._selection = SelectionServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
        self._nats_args = {"servers": [nats_url], "user": nats_user, "password": nats_password} if nats_url else None
        self._nc: Nats | None = None
        self._catalogue = Catalogue(namespace)
        self._source = source

    async def __aenter__(self) -> FlywheelClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()  # every publish was already acked by JetStream
        await self._channel.close()

    async def select(
        self,
        endpoint: str,
        *,
        user_id: str = "",
        context: dict[str, Any] | None = None,
        session_id: str = "",
        timeout_s: float = 2.0,
    ) -> Decision:
        """Ask which arm to use for this request."""
        ctx = Struct()
        ctx.update(context or {})
        resp = await self._selection.Select(
            sel_pb.SelectRequest(endpoint=endpoint, user_id=user_id, context=ctx, session_id=session_id),
            timeout=timeout_s,
            metadata=self._metadata,
        )
        return Decision(
            decision_id=resp.decision_id,
            endpoint=endpoint,
            arm_id=resp.arm_id,
            params=json_format.MessageToDict(resp.params),
            probability=resp.probability,
        )

    async def feedback(
        self,
        decision: Decision,
        *,
        reward: float | None = None,
        signals: dict[str, float] | None = None,
        event_id: str | None = None,
    ) -> str:
        """Publish feedback for a decision on NATS; returns the event id once JetStream stored it."""
        if reward is None and not signals:
            raise ValueError("give a reward or at least one signal")
        if any(not math.isfinite(v) for v in [*(signals or {}).values(), *([reward] if reward is not None else [])]):
            raise ValueError("reward and signals must be finite")
        if self._nats_args is None:
            raise RuntimeError("this client has no nats_url; use update() over gRPC instead")
        if self._nc is None:
            self._nc = await nats.connect(**self._nats_args)
        event_id = event_id or uuid.uuid4().hex
        event = FeedbackEvent(
            meta=EventMeta(event_id=event_id, source=self._source),
            decision_id=decision.decision_id,
            endpoint=decision.endpoint,
            signals=signals or {},
        )
        event.meta.time.GetCurrentTime()
        if reward is not None:
            event.reward = reward
        await self._nc.jetstream().publish(
            self._catalogue.feedback(decision.endpoint),
            event.SerializeToString(),
            headers={"Content-Type": "application/protobuf", "Nats-Msg-Id": event_id},
        )
        return event_id

    async def update(
        self,
        decision: Decision,
        *,
        reward: float | None = None,
        signals: dict[str, float] | None = None,
        feedback_id: str | None = None,
        timeout_s: float = 2.0,
    ) -> sel_pb.UpdateResponse:
        """Report feedback over gRPC (for products without NATS)."""
        request = sel_pb.UpdateRequest(
            decision_id=decision.decision_id, signals=signals or {}, feedback_id=feedback_id or uuid.uuid4().hex
        )
        if reward is not None:
            request.reward = reward
        return await self._selection.Update(request, timeout=timeout_s, metadata=self._metadata)
