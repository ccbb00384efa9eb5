"""Readiness: every service re-checks the servers it depends on and reports SERVING on
gRPC health only while all of them answer; NOT_SERVING otherwise, and during shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from grpc_health.v1 import health, health_pb2
from nats.aio.client import Client as Nats
from sqlalchemy.ext.asyncio import AsyncEngine

from flywheel.core import db
from flywheel.core.logging import get_logger
from flywheel.core.metrics import READY
from flywheel.core.objects import ObjectStore

log = get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class Dependency:
    """A named check that raises when the dependency is unusable."""

    name: str
    check: Callable[[], Awaitable[None]]


def nats_dependency(nc: Nats, *, timeout_s: float = 1.0) -> Dependency:
    async def check() -> None:
        if not nc.is_connected:
            raise ConnectionError("not connected")
        await nc.flush(timeout=timeout_s)  # a round trip, not just a socket that looks open

    return Dependency("nats", check)


def postgres_dependency(engine: AsyncEngine, *, timeout_s: float = 2.0) -> Dependency:
    return Dependency("postgres", lambda: db.ping(engine, timeout_s=timeout_s))


def s3_dependency(store: ObjectStore, *, timeout_s: float = 2.0) -> Dependency:
    return Dependency("s3", lambda: store.ping(timeout_s=timeout_s))


class Readiness:
    """Runs the dependency checks on an interval and mirrors them into gRPC health."""

    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        service_names: list[str],
        dependencies: list[Dependency],
        interval_s: float,
    ) -> None:
        self._servicer = servicer
        self._names = ["", *service_names]  # "" is the server as a whole
        self._deps = dependencies
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._ready: bool | None = None

    @property
    def ready(self) -> bool:
        return bool(self._ready)

    async def check_once(self) -> bool:
        """Check every dependency concurrently; publish the verdict; return it."""
        results = await asyncio.gather(*(d.check() for d in self._deps), return_exceptions=True)
        failed = {d.name: repr(r) for d, r in zip(self._deps, results, strict=True) if isinstance(r, BaseException)}
        for d in self._deps:
            READY.labels(d.name).set(0 if d.name in failed else 1)
        ready = not failed
        if ready != self._ready:
            (log.info if ready else log.warning)("readiness changed", ready=ready, failed=failed)
        self._ready = ready
        await self._set(SERVING if ready else NOT_SERVING)
        return ready

    async def start(self) -> None:
        await self._set(NOT_SERVING)
        self._task = asyncio.create_task(self._loop(), name="readiness")

    async def stop(self) -> None:
        """Report NOT_SERVING for good (load balancers stop sending) and stop checking."""
        if self._task is not None:
            self._task.cancel()
        await self._servicer.enter_graceful_shutdown()

    async def _set(self, status: int) -> None:
        for name in self._names:
            await self._servicer.set(name, status)

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception as exc:  # noqa: BLE001 - a broken check must not end readiness
                log.error("readiness check crashed", error=repr(exc))
            await asyncio.sleep(self._interval_s)
