"""Wiring of the trace store: settings -> connections -> servicers and consumers."""

from __future__ import annotations

from pathlib import Path

from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch, FeedbackEvent
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.spans_pb2 import SpanBatch
from flywheel.core import entrypoint, retention
from flywheel.core.bus.connection import with_ack_wait
from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.trace_store import exports, segments
from flywheel.trace_store.exports import Exporter
from flywheel.trace_store.grpc_api import TraceStoreServicer
from flywheel.trace_store.handlers import DecisionBatchHandler, FeedbackHandler, SpanBatchHandler
from flywheel.trace_store.ingest import SpanWriter
from flywheel.trace_store.retention import Eraser, sweep_forever
from flywheel.trace_store.segments import SegmentStore
from flywheel.trace_store.settings import TraceStoreSettings
from flywheel.trace_store.spans import Limits

NAME = "trace_store"
DURABLES = ("trace-store-decisions", "trace-store-feedback", "trace-store-traces")
MIGRATIONS = Path(__file__).parent / "migrations"


async def build(settings: TraceStoreSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    objects = connect_objects(settings.s3, parts=parts)
    for purpose in (segments.PURPOSE, exports.PURPOSE):
        await objects.ensure_bucket(purpose)
    store = SegmentStore(objects)
    writer = SpanWriter(database.engine, store)
    eraser = Eraser(database.engine, store)
    limits = Limits(
        max_attributes_bytes=settings.max_attributes_bytes,
        max_text_bytes=settings.max_text_bytes,
        max_spans_per_batch=settings.max_spans_per_batch,
    )
    exporter = Exporter(database.sessions, objects, bus.publisher, bus.catalogue)
    parts.servicers.append(
        (
            pb_grpc.add_TraceStoreServiceServicer_to_server,
            TraceStoreServicer(
                database.sessions, writer=writer, segments=store, exporter=exporter, eraser=eraser, limits=limits
            ),
            pb.DESCRIPTOR.services_by_name["TraceStoreService"].full_name,
        )
    )
    decisions, feedback, traces = (with_ack_wait(bus.catalogue.consumer(d), settings.ack_wait_s) for d in DURABLES)
    for spec, message_type, handler in (
        (decisions, DecisionBatch, DecisionBatchHandler(database.sessions)),
        (feedback, FeedbackEvent, FeedbackHandler(database.sessions)),
    ):
        parts.consumers.append(
            EventConsumer(
                js=bus.js,
                catalogue=bus.catalogue,
                spec=spec,
                message_type=message_type,
                handler=handler,
            )
        )
    parts.consumers.append(
        EventConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=traces,
            message_type=SpanBatch,
            batch_handler=SpanBatchHandler(writer, limits),
            batch_size=settings.ingest_batch_size,
        )
    )

    async def sweep() -> None:
        await sweep_forever(
            eraser,
            retention_days=settings.retention_days,
            default_days=settings.default_retention_days,
            interval_s=settings.retention_interval_s,
        )

    parts.background.append(sweep)

    async def sweep_logs() -> None:
        await retention.sweep_forever(
            database.engine,
            [
                retention.Rule("decision_log", "recorded_at", settings.log_retention_days),
                retention.Rule("feedback_log", "recorded_at", settings.log_retention_days),
            ],
            interval_s=settings.retention_interval_s,
            service=NAME,
        )

    parts.background.append(sweep_logs)


def main() -> None:
    """Entry point of ``python -m flywheel.trace_store``."""
    entrypoint.run(name=NAME, settings_cls=TraceStoreSettings, build=build, migrations=MIGRATIONS)
