"""``SyncFlywheelClient``: the ``FlywheelClient`` API for code without an event loop.

    with SyncFlywheelClient(target="127.0.0.1:50051", nats_url="nats://127.0.0.1:4222") as fw:
        with fw.decide("support-bot", user_id="u1") as dc:
            answer = call_llm(**dc.params)
            dc.set_reward(score(answer))

Select and Update use grpcio's blocking stubs. Feedback over NATS runs on one private
asyncio event loop in a daemon thread that the client starts on first use and stops in
``close()``; calls from any thread hand their coroutine to it with
``asyncio.run_coroutine_threadsafe``. The client is thread-safe: share one per process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1.selection_service_pb2_grpc import SelectionServiceStub
from flywheel.api.tls import channel
from flywheel.sdk import _transport
from flywheel.sdk.decision import Decision, DecisionContext, check_feedback

__all__ = ["SyncFlywheelClient"]

log = logging.getLogger("flywheel.sdk")
T = TypeVar("T")


class _LoopThread:
    """One event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="flywheel-sdk-nats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncFlywheelClient cannot be called from its own NATS thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.loop.close()


class SyncFlywheelClient:
    """Blocking client for products (threads, WSGI, scripts). Same arguments as ``FlywheelClient``."""

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
    ) -> None:
        tls = _transport.client_tls(tls_root_certificates, tls_certificate_chain, tls_private_key, tls_server_name)
        self._channel = channel(target, tls)
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
        self._loop: _LoopThread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> SyncFlywheelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop_thread(self) -> _LoopThread:
        with self._lock:
            if self._closed:
                raise RuntimeError("this SyncFlywheelClient is closed")
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    def close(self) -> None:
        """Close the NATS connection, stop the loop thread and close the channel (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, self._loop = self._loop, None
        if loop is not None:
            if self._nats is not None:
                try:
                    loop.call(self._nats.close(), timeout_s=5.0)
                except Exception as exc:  # noqa: BLE001 - closing must not fail the caller
                    log.warning("closing the NATS connection failed: %r", exc)
            loop.stop()
        self._channel.close()

    def select(
        self,
        endpoint: str,
        *,
        user_id: str = "",
        context: dict[str, Any] | None = None,
        session_id: str = "",
        timeout_s: float = 2.0,
    ) -> Decision:
        """Ask which arm to use for this request."""
        resp = self._selection.Select(
            _transport.select_request(endpoint, user_id, context, session_id),
            timeout=timeout_s,
            metadata=self._metadata,
        )
        return _transport.decision_from(endpoint, resp, int_params=self._int_params)

    def feedback(
        self,
        decision: Decision,
        *,
        reward: float | None = None,
        signals: dict[str, float] | None = None,
        event_id: str | None = None,
        timeout_s: float = 5.0,
    ) -> str:
        """Publish feedback for a decision on NATS; returns the event id once JetStream stored it."""
        check_feedback(reward, signals)
        if self._nats is None:
            raise RuntimeError("this client has no nats_url; use update() over gRPC instead")
        coro = self._nats.publish(
            endpoint=decision.endpoint,
            decision_id=decision.decision_id,
            reward=reward,
            signals=signals,
            event_id=event_id,
            timeout_s=timeout_s,
        )
        # The connect (first call only) and the publish each get timeout_s.
        return self._loop_thread().call(coro, timeout_s=2 * timeout_s + 1.0)

    def update(
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
        return self._selection.Update(request, timeout=timeout_s, metadata=self._metadata)

    def report(
        self, decision: Decision, *, reward: float | None = None, signals: dict[str, float] | None = None
    ) -> None:
        """Feedback over NATS when this client has a ``nats_url``, else over gRPC ``Update``."""
        if self._nats is not None:
            self.feedback(decision, reward=reward, signals=signals)
        else:
            self.update(decision, reward=reward, signals=signals)

    @contextmanager
    def decide(
        self,
        endpoint: str,
        *,
        user_id: str = "",
        context: dict[str, Any] | None = None,
        session_id: str = "",
    ) -> Iterator[DecisionContext]:
        """Select on enter, report once on exit; the same contract as ``FlywheelClient.decide``."""
        decision = self.select(endpoint, user_id=user_id, context=context, session_id=session_id)
        ctx = DecisionContext(decision)
        start = time.perf_counter()
        try:
            yield ctx
        except Exception as exc:
            reward, signals = ctx._outcome((time.perf_counter() - start) * 1000.0, failed=True)
            try:
                self.report(decision, reward=reward, signals=signals)
            except Exception as send_error:  # noqa: BLE001 - never hide the block's own exception
                log.warning("could not report the failed decision %s: %r", decision.decision_id, send_error)
                exc.add_note(f"flywheel: reporting decision {decision.decision_id} failed: {send_error!r}")
            raise
        reward, signals = ctx._outcome((time.perf_counter() - start) * 1000.0, failed=False)
        self.report(decision, reward=reward, signals=signals)
