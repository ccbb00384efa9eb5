"""Connecting to NATS from settings, and declaring streams and consumers idempotently."""

from __future__ import annotations

import dataclasses
import ssl
from datetime import timedelta

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from flywheel.api.subjects import Catalogue, ConsumerSpec, Retention, StreamSpec, service_inbox
from flywheel.core.logging import get_logger
from flywheel.core.settings import NatsSettings

log = get_logger(__name__)


def _tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca_file or settings.tls_cert_file or settings.url.startswith("tls://")):
        return None
    ctx = ssl.create_default_context(cafile=str(settings.tls_ca_file) if settings.tls_ca_file else None)
    if settings.tls_cert_file and settings.tls_key_file:
        ctx.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
    return ctx


async def connect(settings: NatsSettings, *, name: str) -> Client:
    """Connect with credentials/TLS from settings; reconnect forever once connected."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error", error=str(exc))

    async def on_disconnect() -> None:
        log.warning("nats disconnected")

    async def on_reconnect() -> None:
        log.info("nats reconnected")

    return await nats.connect(
        servers=[settings.url],
        name=name,
        user=settings.user,
        password=settings.password.get_secret_value() if settings.password else None,
        user_credentials=str(settings.creds_file) if settings.creds_file else None,
        tls=_tls_context(settings),
        connect_timeout=settings.connect_timeout_s,
        # Replies and pulled messages come to the service's own inbox, which its NATS user alone
        # may subscribe to (flywheel.api.subjects.ROLES).
        inbox_prefix=service_inbox(name),
        # A service outlives NATS restarts: keep trying, readiness reports the outage.
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )


_RETENTION = {
    Retention.LIMITS: RetentionPolicy.LIMITS,
    Retention.WORK_QUEUE: RetentionPolicy.WORK_QUEUE,
    Retention.INTEREST: RetentionPolicy.INTEREST,
}


def _stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        description=spec.description,
        retention=_RETENTION[spec.retention],
        storage=StorageType.FILE,
        max_age=spec.max_age.total_seconds(),
        duplicate_window=spec.duplicate_window.total_seconds(),
    )


_DECLARED = ("subjects", "description", "retention", "storage", "max_age", "duplicate_window")


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> None:
    """Create the stream, or update its mutable settings if it exists."""
    config = _stream_config(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(config)
        return
    # Only when a declared setting changed: then a deployment whose admin makes the streams can
    # deny its services STREAM.CREATE/UPDATE (docs/security.md, the bus's users).
    if any(getattr(info.config, f) != getattr(config, f) for f in _DECLARED):
        await js.update_stream(config)


def with_ack_wait(spec: ConsumerSpec, ack_wait_s: float | None) -> ConsumerSpec:
    """``spec`` with a service's ack-wait setting (``FLYWHEEL_<SERVICE>_ACK_WAIT_S``) in place of
    the catalogue's; None keeps the catalogue's. The shorter it is, the sooner what a dead replica
    held comes back; a handler that may run longer must mark its message in progress meanwhile."""
    if ack_wait_s is None:
        return spec
    if not ack_wait_s > 0:
        raise ValueError(f"{spec.durable}: the ack wait must be > 0 s, got {ack_wait_s!r}")
    return dataclasses.replace(spec, ack_wait=timedelta(seconds=ack_wait_s))


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Create the durable pull consumer, or update it to ``spec`` if it exists with other settings
    (add_consumer is idempotent for equal configs; JetStream updates the mutable ones, such as the
    ack wait, in place). Its owner calls this as it starts, so its settings are the ones in force."""
    await js.add_consumer(
        spec.stream,
        ConsumerConfig(
            durable_name=spec.durable,
            description=spec.description,
            filter_subject=spec.filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=spec.ack_wait.total_seconds(),
            max_deliver=spec.max_deliver,
            max_ack_pending=spec.max_ack_pending,
        ),
    )


async def ensure_topology(js: JetStreamContext, catalogue: Catalogue) -> None:
    """Declare every stream of the catalogue. Consumers are declared by their owners, except
    those of interest-retention streams, which must exist before anything is published: those
    are created here when missing, and otherwise left as they are, since their owner may have
    declared them with its own settings (the trace store's ack wait) that the catalogue's
    would undo each time another service starts."""
    for spec in catalogue.streams.values():
        await ensure_stream(js, spec)
    for consumer in catalogue.interest_consumers():
        await ensure_consumer_exists(js, consumer)


async def ensure_consumer_exists(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Create the durable consumer with ``spec`` if it is missing; leave an existing one as it is.
    For those declaring consumers they do not own (the topology every service declares, the
    chart's setup job): the owner declares its own settings (``ensure_consumer``) as it starts,
    and they must not be put back to the catalogue's by anyone else."""
    try:
        await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await ensure_consumer(js, spec)
