"""Wiring of the trace store: settings -> connections -> servicers and consumers."""

from __future__ import annotations

from pathlib import Path

from flywheel.api.optimizer.v1.events_pb2 import DecisionEvent, FeedbackEvent
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.core import entrypoint
from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.trace_store.grpc_api import TraceStoreServicer
from flywheel.trace_store.handlers import DecisionHandler, FeedbackHandler
from flywheel.trace_store.settings import TraceStoreSettings

NAME = "trace_store"
MIGRATIONS = Path(__file__).parent / "migrations"


async def build(settings: TraceStoreSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    connect_objects(settings.s3, parts=parts)  # span segments; checked for readiness
    parts.servicers.append(
        (
            pb_grpc.add_TraceStoreServiceServicer_to_server,
            TraceStoreServicer(database.sessions),
            pb.DESCRIPTOR.services_by_name["TraceStoreService"].full_name,
        )
    )
    for durable, message_type, handler in (
        ("trace-store-decisions", DecisionEvent, DecisionHandler(database.sessions)),
        ("trace-store-feedback", FeedbackEvent, FeedbackHandler(database.sessions)),
    ):
        parts.consumers.append(
            EventConsumer(
                js=bus.js,
                catalogue=bus.catalogue,
                spec=bus.catalogue.consumer(durable),
                message_type=message_type,
                handler=handler,
            )
        )


def main() -> None:
    """Entry point of ``python -m flywheel.trace_store``."""
    entrypoint.run(name=NAME, settings_cls=TraceStoreSettings, build=build, migrations=MIGRATIONS)
