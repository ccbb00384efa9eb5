"""PolicyChangedEvent on ``flywheel.trainer.policy.<name>`` for every status change, published
after the change commits. The history table is the outbox: a row's event id is its JetStream
dedup id, ``published_at`` is set once the stream has stored it, and a sweep publishes the
rows a crash or a bus outage left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import events_pb2, jobs_pb2
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import get_logger
from flywheel.trainer.registry import service
from flywheel.trainer.registry.models import PolicyHistoryRow, PolicyRow

SOURCE = "trainer"
log = get_logger(__name__)


def policy_message(row: PolicyRow) -> jobs_pb2.Policy:
    """The registry row as the API's Policy."""
    policy = jobs_pb2.Policy(
        policy_id=row.policy_id,
        name=row.name,
        version=row.version,
        status=row.status,  # type: ignore[arg-type]
        kind=row.kind,  # type: ignore[arg-type]
        base_model=row.base_model,
        checkpoint_uri=row.checkpoint_uri,
        job_id=row.job_id,
        dataset_uri=row.dataset_uri,
        parent_policy_id=row.parent_policy_id,
        metrics={k: float(v) for k, v in row.metrics.items()},
        endpoint=row.endpoint or "",
        arm_id=row.arm_id or "",
        served_model=row.served_model or "",
    )
    policy.created_at.FromDatetime(row.created_at)
    policy.updated_at.FromDatetime(row.updated_at)
    return policy


def changed_event(history: PolicyHistoryRow, row: PolicyRow) -> events_pb2.PolicyChangedEvent:
    """The event of one history row; ``policy`` shows the status that row set (a republished
    old change says what changed then, not what the version is now)."""
    policy = policy_message(row)
    policy.status = history.status  # type: ignore[assignment]
    policy.updated_at.FromDatetime(history.at)
    event = events_pb2.PolicyChangedEvent(
        meta=EventMeta(event_id=history.event_id, source=SOURCE),
        policy=policy,
        previous_status=history.previous_status,  # type: ignore[arg-type]
    )
    event.meta.time.FromDatetime(history.at)
    return event


class PolicyEvents:
    """Publishes the events of committed history rows, and sweeps up any left unpublished."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], publisher: Publisher, catalogue: Catalogue) -> None:
        self._sessions = sessions
        self._publisher = publisher
        self._catalogue = catalogue

    async def publish(self, history: Sequence[PolicyHistoryRow]) -> None:
        """Publish after the commit; a failure is logged, not raised (the change stands and
        the sweep publishes it later)."""
        try:
            await self._publish(history)
        except Exception as exc:  # noqa: BLE001 - the bus may be down; the outbox keeps the rows
            log.warning("policy events not published yet; the sweep retries", error=repr(exc))

    async def _publish(self, history: Sequence[PolicyHistoryRow]) -> None:
        if not history:
            return
        async with self._sessions() as session:
            # Read back as committed (server-set columns included), in commit order.
            found_history = await session.scalars(
                select(PolicyHistoryRow)
                .where(PolicyHistoryRow.id.in_([h.id for h in history]))
                .order_by(PolicyHistoryRow.id)
            )
            history = found_history.all()
            ids = {h.policy_id for h in history}
            found = await session.scalars(select(PolicyRow).where(PolicyRow.policy_id.in_(ids)))
            rows = {r.policy_id: r for r in found}
            items = [
                (self._catalogue.policy_changed(h.name), changed_event(h, rows[h.policy_id]), h.event_id)
                for h in history
                if h.policy_id in rows
            ]
            # In order, one at a time: a consumer sees a name's changes in the order they happened.
            for subject, event, _ in items:
                await self._publisher.publish(subject, event)
            await service.mark_published(session, ids=[h.id for h in history])

    async def sweep_forever(self, *, interval_s: float, grace_s: float) -> None:
        """Every ``interval_s``, publish the rows older than ``grace_s`` still unpublished."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                async with self._sessions() as session:
                    left = await service.unpublished(session, older_than=datetime.now(UTC) - timedelta(seconds=grace_s))
                if left:
                    await self._publish(left)
                    log.info("policy events published by the sweep", count=len(left))
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("policy event sweep failed", error=repr(exc))
