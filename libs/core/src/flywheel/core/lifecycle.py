"""Running a service: start, serve until SIGTERM, drain, exit.

A service describes itself as :class:`ServiceParts` (its servicers, consumers,
dependencies and what to close); :func:`serve` does the rest the same way for all:
gRPC with health and reflection, readiness, metrics, then on SIGTERM or SIGINT:
NOT_SERVING, stop pulling events and finish the ones in hand, ``server.stop(grace)``,
close connections, return.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.grpc_server import build_server
from flywheel.core.health import Dependency, Readiness
from flywheel.core.logging import get_logger
from flywheel.core.metrics import serve_metrics
from flywheel.core.settings import ServiceSettings

log = get_logger(__name__)


@dataclass
class ServiceParts:
    """Everything a service runs, assembled by its ``app.build``."""

    servicers: list[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]] = field(default_factory=list)
    consumers: list[EventConsumer[Any]] = field(default_factory=list)
    dependencies: list[Dependency] = field(default_factory=list)
    # Called in reverse order on shutdown (close what was opened last first).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # Background tasks to start after the server (e.g. schedulers); cancelled on stop.
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


async def serve(
    settings: ServiceSettings, *, name: str, parts: ServiceParts, stop: asyncio.Event | None = None
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for warning in settings.exposure_warnings():
        log.warning("insecure listener", detail=warning)
    tls = settings.metrics_tls
    serve_metrics(
        settings.metrics_host,
        settings.metrics_port,
        certfile=settings.tls_cert_file if tls else None,
        keyfile=settings.tls_key_file if tls else None,
        client_cafile=settings.tls_client_ca_file if tls else None,
    )

    server, health_servicer, port = build_server(settings, parts.servicers)
    readiness = Readiness(
        health_servicer, [n for _, _, n in parts.servicers], parts.dependencies, settings.readiness_interval_s
    )
    await server.start()
    await readiness.start()
    for consumer in parts.consumers:
        await consumer.start()
    tasks = [asyncio.create_task(job()) for job in parts.background]
    log.info(
        "serving",
        service=name,
        grpc=f"{settings.grpc_host}:{port}",
        tls="mtls" if settings.tls_client_ca_file else bool(settings.tls_cert_file),
        token=settings.auth_token is not None,
        metrics=f"{'https' if settings.metrics_tls else 'http'}://{settings.metrics_host}:{settings.metrics_port}"
        if settings.metrics_port
        else "off",
    )

    await stop.wait()
    log.info("stopping", grace_s=settings.shutdown_grace_s)
    await readiness.stop()
    await asyncio.gather(*(c.stop(settings.shutdown_grace_s) for c in parts.consumers))
    log.debug("consumers stopped")
    for task in tasks:
        task.cancel()
    await server.stop(settings.shutdown_grace_s)
    log.debug("grpc server stopped")
    for close in reversed(parts.closers):
        try:
            await close()
        except Exception as exc:  # noqa: BLE001 - keep closing the rest
            log.warning("close failed", error=repr(exc))
    log.info("stopped", service=name)
