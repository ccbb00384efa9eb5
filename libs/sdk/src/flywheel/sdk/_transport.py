"""Pieces the async and sync clients share: request building, and feedback over NATS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import grpc
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.tls import ClientTls, channel
from flywheel.sdk.decision import Decision, check_feedback, plain_number

if TYPE_CHECKING:
    from nats.aio.client import Client as Nats


def metadata(auth_token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {auth_token}"),) if auth_token else ()


# Environment variables a product's process (and the CLI) may set for TLS, and the client
# argument each becomes: the files' contents, or the name to expect in the server's certificate.
TLS_ENV = (
    ("FLYWHEEL_TLS_CA_FILE", "tls_root_certificates"),
    ("FLYWHEEL_TLS_CERT_FILE", "tls_certificate_chain"),
    ("FLYWHEEL_TLS_KEY_FILE", "tls_private_key"),
    ("FLYWHEEL_TLS_SERVER_NAME", "tls_server_name"),
)


def tls_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Client TLS arguments from ``FLYWHEEL_TLS_*`` (only those set); an unreadable file
    raises ValueError naming its variable."""
    out: dict[str, Any] = {}
    for var, key in TLS_ENV:
        value = env.get(var)
        if not value:
            continue
        if key == "tls_server_name":
            out[key] = value
            continue
        try:
            out[key] = Path(value).read_bytes()
        except OSError as exc:
            raise ValueError(f"{var}={value}: {exc.strerror or exc}") from None
    return out


def client_tls(
    root_certificates: bytes | None = None,
    certificate_chain: bytes | None = None,
    private_key: bytes | None = None,
    server_name: str | None = None,
) -> ClientTls | None:
    """TLS when any TLS argument is given (mTLS with a client certificate and key), else None."""
    if not (root_certificates or certificate_chain or private_key or server_name):
        return None
    return ClientTls(root_certificates, certificate_chain, private_key, server_name)


class BlockingClient:
    """The channel, credentials, bearer token and per-call timeout the blocking admin and run
    clients share; subclasses make their stubs in ``_bind`` and call through ``_call``.

    TLS is on when any ``tls_*`` argument is given: ``tls_root_certificates`` (PEM CA; the
    system roots without it), ``tls_certificate_chain`` and ``tls_private_key`` (PEM client
    certificate and key, for a server that requires mTLS), ``tls_server_name`` (the name
    to expect in the server's certificate when the target's host is not in it)."""

    def __init__(
        self,
        *,
        target: str,
        auth_token: str | None = None,
        tls_root_certificates: bytes | None = None,
        tls_certificate_chain: bytes | None = None,
        tls_private_key: bytes | None = None,
        tls_server_name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        tls = client_tls(tls_root_certificates, tls_certificate_chain, tls_private_key, tls_server_name)
        self._channel = channel(target, tls)
        self._metadata = metadata(auth_token)
        self._timeout = timeout_s
        self._bind(self._channel)

    def _bind(self, channel: grpc.Channel) -> None:
        """Make the service stubs on ``channel``."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        return method(request, timeout=self._timeout, metadata=self._metadata)


def select_request(
    endpoint: str, user_id: str, context: dict[str, Any] | None, session_id: str
) -> sel_pb.SelectRequest:
    ctx = Struct()
    ctx.update(context or {})
    return sel_pb.SelectRequest(endpoint=endpoint, user_id=user_id, context=ctx, session_id=session_id)


def decision_from(endpoint: str, resp: sel_pb.SelectResponse, *, int_params: bool = True) -> Decision:
    """The Decision of a SelectResponse; ``int_params`` turns integral numbers back into ints
    (the rule is in ``flywheel.sdk.decision``)."""
    params = json_format.MessageToDict(resp.params)
    return Decision(
        decision_id=resp.decision_id,
        endpoint=endpoint,
        arm_id=resp.arm_id,
        params=plain_number(params) if int_params else params,
        probability=resp.probability,
    )


def update_request(
    decision_id: str, reward: float | None, signals: dict[str, float] | None, feedback_id: str | None
) -> sel_pb.UpdateRequest:
    check_feedback(reward, signals)
    request = sel_pb.UpdateRequest(
        decision_id=decision_id, signals=signals or {}, feedback_id=feedback_id or uuid.uuid4().hex
    )
    if reward is not None:
        request.reward = reward
    return request


class NatsFeedback:
    """Publishes FeedbackEvents on JetStream. Connects on first use, on the loop it is used from.

    The event id is also JetStream's ``Nats-Msg-Id``, so a retried publish is stored once and
    the optimizer applies it once.
    """

    def __init__(self, *, url: str, user: str | None, password: str | None, namespace: str, source: str) -> None:
        self._args: dict[str, Any] = {"servers": [url], "user": user, "password": password}
        self._catalogue = Catalogue(namespace)
        self._source = source
        self._nc: Nats | None = None
        self._lock: asyncio.Lock | None = None

    async def _connection(self) -> Nats:
        if self._nc is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._nc is None:
                    import nats  # lazily: only products that publish on NATS pay for importing it

                    self._nc = await nats.connect(**self._args)
        return self._nc

    async def publish(
        self,
        *,
        endpoint: str,
        decision_id: str,
        reward: float | None,
        signals: dict[str, float] | None,
        event_id: str | None = None,
        timeout_s: float = 5.0,
    ) -> str:
        check_feedback(reward, signals)
        subject = self._catalogue.feedback(endpoint)
        event_id = event_id or uuid.uuid4().hex
        event = FeedbackEvent(
            meta=EventMeta(event_id=event_id, source=self._source),
            decision_id=decision_id,
            endpoint=endpoint,
            signals=signals or {},
        )
        event.meta.time.GetCurrentTime()
        if reward is not None:
            event.reward = reward
        nc = await self._connection()
        await nc.jetstream().publish(
            subject,
            event.SerializeToString(),
            headers={"Content-Type": "application/protobuf", "Nats-Msg-Id": event_id},
            timeout=timeout_s,
        )
        return event_id

    async def close(self) -> None:
        if self._nc is not None:
            nc, self._nc = self._nc, None
            await nc.close()  # every publish was already acked by JetStream
