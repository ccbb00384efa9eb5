"""The real optimizer process with proposed consumer changes applied in-process, so run.py
can measure them side by side with the unchanged service (``--variants``):

    BENCH_VARIANT=sql+batch1000 python bench/feedback/variants.py

Nothing under services/ or libs/ is edited; each variant below is the exact change
proposed for the named file (see bench/feedback/README.md for the diffs):

- ``baseline``: unchanged (the same launcher, so the comparison is like for like).
- ``sql``: ``service.apply_feedback_batch`` looks decisions up with one cached
  ``decision_id = ANY(:ids)`` query of the columns it needs (no ORM objects), and writes the
  dedup rows with one cached ``INSERT ... SELECT FROM unnest(:ids, :decisions, :rewards)``
  instead of a multi-row VALUES statement that SQLAlchemy compiles anew for every batch.
- ``batch1000``: ``EventConsumer`` fetches up to 1000 messages per batch (default 256).
- ``acks``: ``EventConsumer._settle`` acks successes without the per-message structlog
  context (it is only needed for the warning and dead-letter paths).
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from sqlalchemy import Float, String, any_, bindparam, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.bus import consumer as consumer_module
from flywheel.core.errors import InvalidArgument, NotFound, ServiceError
from flywheel.optimizer import service, stats
from flywheel.optimizer.models import ArmRow, DecisionRow, EndpointRow
from flywheel.optimizer.rewards import combine_reward
from flywheel.optimizer.service import FeedbackItem, FeedbackOutcome, _check, _missing_decision
from flywheel.optimizer.spec import PolicyConfig

# --- variant "sql": the proposed statements of service.apply_feedback_batch ------------------

_DECISIONS = select(
    DecisionRow.decision_id,
    DecisionRow.endpoint,
    DecisionRow.arm_id,
    DecisionRow.segment,
    DecisionRow.features,
    DecisionRow.created_at,
).where(DecisionRow.decision_id == any_(bindparam("ids", type_=ARRAY(String))))

_DEDUP = text(
    "INSERT INTO applied_feedback (event_id, decision_id, reward) "
    "SELECT * FROM unnest(:event_ids, :decision_ids, :rewards) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
).bindparams(
    bindparam("event_ids", type_=ARRAY(String)),
    bindparam("decision_ids", type_=ARRAY(String)),
    bindparam("rewards", type_=ARRAY(Float)),
)


async def apply_feedback_batch_sql(
    session: AsyncSession, *, items: list[FeedbackItem], window: timedelta
) -> list[FeedbackOutcome | ServiceError]:
    """service.apply_feedback_batch with the two batch statements replaced (marked CHANGED)."""
    outcomes: list[FeedbackOutcome | ServiceError | None] = [None] * len(items)
    for i, item in enumerate(items):
        try:
            _check(item)
        except ServiceError as exc:
            outcomes[i] = exc
    ids = {it.decision_id for i, it in enumerate(items) if outcomes[i] is None}
    # CHANGED: one cached statement, plain rows instead of ORM objects.
    decisions = {d.decision_id: d for d in (await session.execute(_DECISIONS, {"ids": list(ids)})).all()} if ids else {}
    names = {d.endpoint for d in decisions.values()}
    endpoints = (
        {e.name: e for e in (await session.scalars(select(EndpointRow).where(EndpointRow.name.in_(names)))).all()}
        if names
        else {}
    )

    now = datetime.now(UTC)
    pending: list[tuple[int, DecisionRow, float]] = []
    for i, item in enumerate(items):
        if outcomes[i] is not None:
            continue
        decision = decisions.get(item.decision_id)
        if decision is None:
            outcomes[i] = _missing_decision(item.decision_id)
            continue
        endpoint = endpoints.get(decision.endpoint)
        if endpoint is None:
            outcomes[i] = NotFound(f"endpoint {decision.endpoint!r} of decision {item.decision_id!r} is gone")
            continue
        if now - decision.created_at > window:
            outcomes[i] = InvalidArgument(f"decision {item.decision_id!r} is older than the feedback window ({window})")
            continue
        try:
            value = combine_reward(item.reward, item.signals, endpoint.reward_spec.get("signal_weights", {}))
        except ValueError as exc:
            outcomes[i] = InvalidArgument(str(exc))
            continue
        if endpoint.reward_spec.get("bounded", True):
            value = min(1.0, max(0.0, value))
        pending.append((i, decision, value))  # type: ignore[arg-type]  # a Row with DecisionRow's columns

    applied_ids: set[str] = set()
    if pending:
        # CHANGED: one cached INSERT ... SELECT FROM unnest(...) whatever the batch size.
        result = await session.execute(
            _DEDUP,
            {
                "event_ids": [items[i].event_id for i, _, _ in pending],
                "decision_ids": [d.decision_id for _, d, _ in pending],
                "rewards": [v for _, _, v in pending],
            },
        )
        applied_ids = set(result.scalars().all())

    increments: dict[tuple[str, str, str], stats.Increment] = defaultdict(stats.Increment)
    totals: dict[tuple[str, str], stats.Increment] = defaultdict(stats.Increment)
    for i, decision, value in pending:
        event_id = items[i].event_id
        applied = event_id in applied_ids
        applied_ids.discard(event_id)  # a repeat inside the same batch is a duplicate too
        outcomes[i] = FeedbackOutcome(applied=applied, endpoint=decision.endpoint, arm_id=decision.arm_id, reward=value)
        if applied:
            for segment in {"", decision.segment}:
                increments[(decision.endpoint, decision.arm_id, segment)].add(value, decision.features)
            totals[(decision.endpoint, decision.arm_id)].add(value, None)
    for (endpoint, arm_id, segment), inc in sorted(increments.items()):
        row = endpoints[endpoint]
        policy = PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
        await stats.add(session, endpoint=endpoint, arm_id=arm_id, segment=segment, policy=policy, inc=inc)
    for (endpoint, arm_id), inc in sorted(totals.items()):
        await session.execute(
            update(ArmRow)
            .where(ArmRow.endpoint == endpoint, ArmRow.arm_id == arm_id)
            .values(pulls=ArmRow.pulls + int(inc.w), reward_sum=ArmRow.reward_sum + inc.s)
        )
    await session.commit()
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def _sql() -> None:
    service.apply_feedback_batch = apply_feedback_batch_sql  # handlers.py calls it through the module


# --- variant "batch1000" ---------------------------------------------------------------------


def _batch1000() -> None:
    consumer_module.EventConsumer.__init__.__kwdefaults__["batch_size"] = 1000


# --- variant "acks" --------------------------------------------------------------------------

_original_settle = consumer_module.EventConsumer._settle


async def _settle_fast(self, msg, delivery, outcome):  # type: ignore[no-untyped-def]
    if outcome is None:
        await msg.ack()
        consumer_module.EVENTS_TOTAL.labels(self.name, "ack").inc()
        return
    await _original_settle(self, msg, delivery, outcome)


def _acks() -> None:
    consumer_module.EventConsumer._settle = _settle_fast


PATCHES = {"baseline": lambda: None, "sql": _sql, "batch1000": _batch1000, "acks": _acks}


def apply(spec: str) -> None:
    for name in filter(None, spec.split("+")):
        if name not in PATCHES:
            raise SystemExit(f"unknown variant {name!r}; known: {', '.join(PATCHES)}")
        PATCHES[name]()


if __name__ == "__main__":
    apply(os.environ.get("BENCH_VARIANT", ""))
    from flywheel.optimizer.app import main

    profile_to = os.environ.get("BENCH_PROFILE")  # a cProfile dump at exit, for finding the next hot spot
    if not profile_to:
        main()
    else:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            main()
        finally:
            profiler.disable()
            profiler.dump_stats(profile_to)
