"""Wiring of the optimizer: settings -> connections -> servicers and consumers."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.core import entrypoint
from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.optimizer.events import DecisionPublisher
from flywheel.optimizer.grpc_api import EndpointAdminServicer, SelectionServicer
from flywheel.optimizer.handlers import FeedbackHandler
from flywheel.optimizer.settings import OptimizerSettings

NAME = "optimizer"
MIGRATIONS = Path(__file__).parent / "migrations"


async def build(settings: OptimizerSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    connect_objects(settings.s3, parts=parts)  # run reports (batch runs); checked for readiness
    window = timedelta(seconds=settings.feedback_window_s)
    decisions = DecisionPublisher(bus.publisher, bus.catalogue)
    parts.servicers += [
        (
            sel_grpc.add_SelectionServiceServicer_to_server,
            SelectionServicer(database.sessions, decisions, window),
            sel_pb.DESCRIPTOR.services_by_name["SelectionService"].full_name,
        ),
        (
            admin_grpc.add_EndpointAdminServiceServicer_to_server,
            EndpointAdminServicer(database.sessions),
            admin_pb.DESCRIPTOR.services_by_name["EndpointAdminService"].full_name,
        ),
    ]
    parts.consumers.append(
        EventConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=bus.catalogue.consumer("optimizer-feedback"),
            message_type=FeedbackEvent,
            handler=FeedbackHandler(database.sessions, window),
        )
    )


def main() -> None:
    """Entry point of ``python -m flywheel.optimizer``."""
    entrypoint.run(name=NAME, settings_cls=OptimizerSettings, build=build, migrations=MIGRATIONS)
