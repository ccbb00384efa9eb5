"""The product-side client: ``select`` over gRPC, ``feedback`` over NATS JetStream.

    async with FlywheelClient(target="127.0.0.1:50051", nats_url="nats://127.0.0.1:4222") as fw:
        d = await fw.select("support-bot", user_id="u1")
        ...  # use d.params
        await fw.feedback(d, reward=1.0)

        # or let the client time the request and report once, errors included:
        async with fw.decide("support-bot", user_id="u1") as dc:
            answer = await call_llm(**dc.params)
            dc.add_cost(0.0021)
            dc.set_reward(score(answer))

Feedback is published with a fresh event id that is also JetStream's dedup id, so a
retried publish is stored once and the optimizer applies it once. ``update`` reports the
same feedback over gRPC for products without NATS. ``SyncFlywheelClient``
(``flywheel.sdk.sync``) is the same API for code without an event loop.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1.selection_service_pb2_grpc import SelectionServiceStub
from flywheel.api.tls import aio_channel
from flywheel.sdk import _transport
from flywheel.sdk.decision import Decision, DecisionContext, check_feedback
from flywheel.sdk.feedback_queue import FeedbackQueue, FeedbackQueueStats

__all__ = ["Decision", "DecisionContext", "FlywheelClient"]

log = logging.getLogger("flywheel.sdk")


class FlywheelClient:
    """Async client for products. Credentials and TLS are arguments, never logged.

    One client serves any number of concurrent requests; create it once per event loop.
    """

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
        tls_certificate_chain: bytes | None = None,
        tls_private_key: bytes | None = None,
        tls_server_name: str | None = None,
        source: str = "sdk",
        int_params: bool = True,
        feedback_max_pending: int = 10_000,
        feedback_max_in_flight: int = 64,
    ) -> None:
        tls = _transport.client_tls(tls_root_certificates, tls_certificate_chain, tls_private_key, tls_server_name)
        self._channel = aio_channel(target, tls)
        self._selection = SelectionServiceStub(self._channel)
        self._metadata = _transport.metadata(auth_token)
        self._int_params = int_params  # integral param numbers as int (see flywheel.sdk.decision)
        self._nats = (
            _transport.NatsFeedback(
                url=nats_url, user=nats_user, password=nats_password, namespace=namespace, source=source
            )
            if nats_url
            else None
        )
        # feedback_nowait's bounded background publisher (see flywheel.sdk.feedback_queue)
        self._feedback_queue = (
            FeedbackQueue(
                self._publish_feedback, max_pending=feedback_max_pending, max_in_flight=feedback_max_in_flight
            )
            if self._nats is not None
            else None
        )

    async def __aenter__(self) -> FlywheelClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush queued feedback (``feedback_nowait``), then close NATS and the channel."""
        if self._feedback_queue is not None:
            await self._feedback_queue.close()
        if self._nats is not None:
            await self._nats.close()
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
        resp = await self._selection.Select(
            _transport.select_request(endpoint, user_id, context, session_id),
            timeout=timeout_s,
            metadata=self._metadata,
        )
        return _transport.decision_from(endpoint, resp, int_params=self._int_params)

    async def feedback(
        self,
        decision: Decision,
        *,
        reward: float | None = None,
        signals: dict[str, float] | None = None,
        event_id: str | None = None,
    ) -> str:
        """Publish feedback for a decision on NATS; returns the event id once JetStream stored it."""
        check_feedback(reward, signals)
        if self._nats is None:
            raise RuntimeError("this client has no nats_url; use update() over gRPC instead")
        return await self._nats.publish(
            endpoint=decision.endpoint,
            decision_id=decision.decision_id,
            reward=reward,
            signals=signals,
            event_id=event_id,
        )

    def feedback_nowait(
        self,
        decision: Decision,
        *,
        reward: float | None = None,
        signals: dict[str, float] | None = None,
        event_id: str | None = None,
    ) -> str:
        """Queue feedback for a decision and return its event id at once; background tasks
        publish it (many acknowledgements awaited concurrently, retried with the same event id).
        Raises ``FeedbackQueueFull`` when ``feedback_max_pending`` events are waiting.
        ``flush_feedback()`` waits for them; ``close()`` flushes."""
        check_feedback(reward, signals)
        if self._feedback_queue is None:
            raise RuntimeError("this client has no nats_url; use update() over gRPC instead")
        event_id = event_id or uuid.uuid4().hex
        self._feedback_queue.put_nowait(
            endpoint=decision.endpoint,
            decision_id=decision.decision_id,
            reward=reward,
            signals=signals,
            event_id=event_id,
        )
        return event_id

    async def flush_feedback(self) -> FeedbackQueueStats:
        """Wait until every ``feedback_nowait`` event so far is acknowledged (or failed past its
        retry deadline); returns the counts (queued, acked, retried, failed, last errors)."""
        if self._feedback_queue is None:
            return FeedbackQueueStats()
        await self._feedback_queue.flush()
        return self._feedback_queue.stats

    async def _publish_feedback(
        self, endpoint: str, decision_id: str, reward: float | None, signals: dict[str, float] | None, event_id: str
    ) -> object:
        assert self._nats is not None
        return await self._nats.publish(
            endpoint=endpoint, decision_id=decision_id, reward=reward, signals=signals, event_id=event_id
        )

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
        request = _transport.update_request(decision.decision_id, reward, signals, feedback_id)
        return await self._selection.Update(request, timeout=timeout_s, metadata=self._metadata)

    async def report(
        self, decision: Decision, *, reward: float | None = None, signals: dict[str, float] | None = None
    ) -> None:
        """Feedback over NATS when this client has a ``nats_url``, else over gRPC ``Update``."""
        if self._nats is not None:
            await self.feedback(decision, reward=reward, signals=signals)
        else:
            await self.update(decision, reward=reward, signals=signals)

    @asynccontextmanager
    async def decide(
        self,
        endpoint: str,
        *,
        user_id: str = "",
        context: dict[str, Any] | None = None,
        session_id: str = "",
    ) -> AsyncIterator[DecisionContext]:
        """Select on enter, report once on exit.

        The block gets a ``DecisionContext`` (``.params``, ``.decision``, ``.set_reward``,
        ``.add_signal``, ``.add_cost``). On exit one feedback is sent (see ``report``) with
        the block's wall time as signal ``latency_ms``, ``cost_usd`` when ``add_cost`` was
        called, and the reward and signals the block set. If the block raises an
        ``Exception``, the feedback is reward 0.0 with signal ``error=1.0`` and the
        exception propagates; a failure to send that feedback is logged and noted on the
        exception, never raised in its place. Cancellation (``BaseException``) reports
        nothing. Latency and cost are signals, not rewards: see ``flywheel.sdk.decision``.
        """
        decision = await self.select(endpoint, user_id=user_id, context=context, session_id=session_id)
        ctx = DecisionContext(decision)
        start = time.perf_counter()
        try:
            yield ctx
        except Exception as exc:
            reward, signals = ctx._outcome((time.perf_counter() - start) * 1000.0, failed=True)
            try:
                await self.report(decision, reward=reward, signals=signals)
            except Exception as send_error:  # noqa: BLE001 - never hide the block's own exception
                log.warning("could not report the failed decision %s: %r", decision.decision_id, send_error)
                exc.add_note(f"flywheel: reporting decision {decision.decision_id} failed: {send_error!r}")
            raise
        reward, signals = ctx._outcome((time.perf_counter() - start) * 1000.0, failed=False)
        await self.report(decision, reward=reward, signals=signals)
