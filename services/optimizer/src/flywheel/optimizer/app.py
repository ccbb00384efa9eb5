"""Wiring of the optimizer: settings -> connections -> hot path, servicers, consumers, jobs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from flywheel.api.evaluator.v1.events_pb2 import EvaluationResult
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2_grpc as ope_grpc
from flywheel.api.optimizer.v1 import run_service_pb2 as run_pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as run_grpc
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.society.v1.events_pb2 import ProposalEvent
from flywheel.core import entrypoint
from flywheel.core.bus.consumer import EventConsumer
from flywheel.core.infra import connect_bus, connect_database, connect_objects
from flywheel.core.lifecycle import ServiceParts
from flywheel.core.retention import sweep_forever
from flywheel.optimizer import notify, retention
from flywheel.optimizer.arm_lifecycle import ArmLifecycle
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.decisions import DecisionLog
from flywheel.optimizer.fold import Notice
from flywheel.optimizer.grpc_api import EndpointAdminServicer, OffPolicyServicer, SelectionServicer
from flywheel.optimizer.handlers import FeedbackHandler
from flywheel.optimizer.peer_folds import PeerFolds
from flywheel.optimizer.provisional import ProvisionalFolder, RecentDecisions
from flywheel.optimizer.runs.driver import RunDriver
from flywheel.optimizer.runs.grpc_api import RunServicer
from flywheel.optimizer.runs.proposals import ProposalHandler
from flywheel.optimizer.runs.results import EvaluationResultHandler
from flywheel.optimizer.runs.service import RunLimits
from flywheel.optimizer.segment_cache import SegmentCache
from flywheel.optimizer.selector import Selector, StickySessions
from flywheel.optimizer.settings import OptimizerSettings

NAME = "optimizer"
MIGRATIONS = Path(__file__).parent / "migrations"


def _service_name(module: object, service: str) -> str:
    return module.DESCRIPTOR.services_by_name[service].full_name  # type: ignore[attr-defined]


async def build(settings: OptimizerSettings, parts: ServiceParts) -> None:
    bus = await connect_bus(settings.nats, name=NAME, parts=parts)
    database = connect_database(settings.db, parts=parts)
    objects = connect_objects(settings.s3, parts=parts)  # batch runs' result files
    window = timedelta(seconds=settings.feedback_window_s)

    # Posterior freshness (README): this replica's feedback is folded into its cache at once,
    # other replicas' arrives by NOTIFY; the periodic refresh reconciles.
    replica = uuid.uuid4().hex[:12]
    notifying = settings.posterior_fold and settings.posterior_notify

    async def announce(endpoint: str) -> None:
        await notify.announce_reload(database.engine, replica=replica, endpoint=endpoint)

    cache = PosteriorCache(
        database.sessions,
        refresh_interval_s=settings.refresh_interval_s,
        rebuild_interval_s=settings.posterior_rebuild_interval_s,
        fold_draws=settings.posterior_fold_draws,
        redraw_ahead_ess=settings.posterior_redraw_ahead_ess,
        replica=replica if notifying else "",
        announce=announce if notifying else None,
    )
    folds = cache if settings.posterior_fold else None
    await cache.refresh()
    # Provisional folds (provisional.py): the rewards of this replica's decisions reach its
    # cache as they are published, before their transactions.
    recent = (
        RecentDecisions(settings.provisional_recent_decisions)
        if settings.posterior_fold and settings.posterior_provisional_fold
        else None
    )
    decisions = DecisionLog(
        database.engine,
        bus.publisher,
        bus.catalogue,
        flush_interval_s=settings.decision_flush_interval_s,
        max_pending=settings.decision_log_max_pending,
        room_wait_s=settings.decision_log_room_wait_s,
        recent=recent,
    )
    # Segmented endpoints: per-segment snapshots, refreshed in the background (segment_cache.py).
    segments = SegmentCache(
        database.sessions,
        cache,
        refresh_interval_s=settings.refresh_interval_s,
        max_segments=settings.max_cached_segments,
        redraw_ahead_ess=settings.posterior_redraw_ahead_ess,
    )
    if settings.posterior_fold:
        cache.fold_segments_into(segments.fold_many, segments.settle)
    selector = Selector(cache, decisions, StickySessions(database.sessions), segments)
    lifecycle = ArmLifecycle(database.sessions, cache, interval_s=settings.lifecycle_interval_s)

    parts.servicers += [
        (
            sel_grpc.add_SelectionServiceServicer_to_server,
            SelectionServicer(selector, database.sessions, decisions, cache, window, fold=folds is not None),
            _service_name(sel_pb, "SelectionService"),
        ),
        (
            admin_grpc.add_EndpointAdminServiceServicer_to_server,
            EndpointAdminServicer(database.sessions, cache),
            _service_name(admin_pb, "EndpointAdminService"),
        ),
        (
            ope_grpc.add_OffPolicyServiceServicer_to_server,
            OffPolicyServicer(database.sessions, cache),
            _service_name(ope_pb, "OffPolicyService"),
        ),
        (
            run_grpc.add_RunServiceServicer_to_server,
            RunServicer(
                database.sessions,
                objects,
                policy=settings.run_policy,
                limits=RunLimits(
                    population=settings.run_max_population,
                    generations=settings.run_max_generations,
                    test_cases=settings.run_max_test_cases,
                    evaluations=settings.run_max_evaluations,
                    parallel_workers=settings.run_max_parallel_workers,
                ),
            ),
            _service_name(run_pb, "RunService"),
        ),
    ]
    parts.consumers.append(
        EventConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=bus.catalogue.consumer("optimizer-feedback"),
            message_type=FeedbackEvent,
            batch_handler=FeedbackHandler(database.sessions, window, decisions, folds),
            batch_size=1000,  # one transaction per 1000 events when there is a backlog
            prefetch=settings.feedback_prefetch,
            max_batches=settings.feedback_max_batches,
        )
    )
    # Batch runs: results fold in exactly once (a row per run, candidate and test case);
    # proposals from the society go into the running generation.
    parts.consumers += [
        EventConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=bus.catalogue.consumer("optimizer-evaluation-results"),
            message_type=EvaluationResult,
            batch_handler=EvaluationResultHandler(database.sessions),
            batch_size=256,
        ),
        EventConsumer(
            js=bus.js,
            catalogue=bus.catalogue,
            spec=bus.catalogue.consumer("optimizer-proposals"),
            message_type=ProposalEvent,
            handler=ProposalHandler(database.sessions),
        ),
    ]
    driver = RunDriver(database.sessions, bus.publisher, bus.catalogue, objects, tick_s=settings.run_tick_s)
    parts.background += [cache.run, segments.run, decisions.run, lifecycle.run, driver.run]
    peers = None
    if recent is not None and notifying and settings.posterior_peer_fold:
        # Replicas tell each other their provisional folds (peer_folds.py); NOTIFY settles them.
        peers = PeerFolds(
            cache,
            replica=replica,
            subject=bus.catalogue.peer_fold(replica),
            peers_subject=bus.catalogue.peer_fold("KEY").rsplit(".", 1)[0] + ".*",
            segments=segments,
        )

        async def peer_folds() -> None:
            await peers.run(bus.nc)

        parts.background.append(peer_folds)
    if recent is not None:
        folder = ProvisionalFolder(cache, recent, window=window, segments=segments, peers=peers)
        feedback = bus.catalogue.consumer("optimizer-feedback").filter_subject

        async def provisional_folds() -> None:
            await folder.run(bus.nc, feedback)

        parts.background.append(provisional_folds)
    if notifying:

        def on_notice(notice: Notice) -> None:
            if peers is not None:
                peers.heard_peer()
            cache.notice(notice)

        listener = notify.IncrementListener(
            database.engine, replica=replica, on_notice=on_notice, on_connect=cache.refresh
        )
        parts.background.append(listener.run)

    async def retention_sweep() -> None:
        await sweep_forever(
            database.engine, retention.rules(settings), interval_s=settings.retention_interval_s, service=NAME
        )

    parts.background.append(retention_sweep)
    # Closers run in reverse: the decision buffer is flushed before the database closes.
    parts.closers.append(decisions.close)


def main() -> None:
    """Entry point of ``python -m flywheel.optimizer``."""
    entrypoint.run(name=NAME, settings_cls=OptimizerSettings, build=build, migrations=MIGRATIONS)
