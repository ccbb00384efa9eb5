"""Connecting a service to the servers it needs, from its settings, in one call.

Each connection registers its readiness check and its closer on the service's
:class:`ServiceParts`, so no service repeats the wiring."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client as Nats
from nats.js import JetStreamContext
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from flywheel.api.subjects import Catalogue
from flywheel.core import db
from flywheel.core.bus.connection import connect, ensure_topology
from flywheel.core.bus.publisher import Publisher
from flywheel.core.health import nats_dependency, postgres_dependency, s3_dependency
from flywheel.core.lifecycle import ServiceParts
from flywheel.core.objects import ObjectStore
from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings


@dataclass
class Bus:
    nc: Nats
    js: JetStreamContext
    catalogue: Catalogue
    publisher: Publisher


@dataclass
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]


async def connect_bus(settings: NatsSettings, *, name: str, parts: ServiceParts) -> Bus:
    """Connect to NATS, declare the catalogue's streams, register readiness and drain."""
    nc = await connect(settings, name=name)
    js = nc.jetstream()
    catalogue = Catalogue(settings.namespace)
    await ensure_topology(js, catalogue)
    parts.dependencies.append(nats_dependency(nc))
    parts.closers.append(nc.close)  # publishes are awaited for their acks, so nothing is left to drain
    return Bus(nc=nc, js=js, catalogue=catalogue, publisher=Publisher(js))


def connect_database(settings: DatabaseSettings, *, parts: ServiceParts) -> Database:
    engine = db.create_engine(settings)
    parts.dependencies.append(postgres_dependency(engine))
    parts.closers.append(engine.dispose)
    return Database(engine=engine, sessions=db.session_factory(engine))


def connect_objects(settings: S3Settings, *, parts: ServiceParts) -> ObjectStore:
    store = ObjectStore(settings)
    parts.dependencies.append(s3_dependency(store))
    return store
