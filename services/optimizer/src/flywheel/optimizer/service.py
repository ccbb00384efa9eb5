"""Optimizer domain operations on PostgreSQL: endpoint administration and feedback.

Keyword-only functions that take the session explicitly and raise flywheel.core.errors
exceptions; they never touch gRPC or NATS. Selection lives in selector.py (hot path).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from prometheus_client import Counter
from sqlalchemy import JSON, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServiceError,
    Unavailable,
)
from flywheel.core.logging import get_logger
from flywheel.core.validation import check_numbers, check_string
from flywheel.optimizer import notify, stats
from flywheel.optimizer.decisions import decision_age_s
from flywheel.optimizer.fold import FoldBatch
from flywheel.optimizer.models import ArmRow, EndpointRow
from flywheel.optimizer.rewards import combine_reward
from flywheel.optimizer.spec import (
    ACTIVE,
    CANARY,
    LINEAR,
    MAX_ABS_REWARD,
    RETIRED,
    ArmSpec,
    EndpointSpec,
    PolicyConfig,
    check_arm,
    check_policy,
    validate_endpoint,
)

log = get_logger(__name__)

# Feedback for a decision younger than this that is not in the log yet is retried, not
# rejected: the deciding replica may not have flushed it.
DECISION_GRACE_S = 30.0
# Column widths of applied_feedback / decisions (migrations/versions/0001_initial.py).
EVENT_ID_CHARS = 128
DECISION_ID_CHARS = 64
ENDPOINT_CHARS = 64

# The statements of a feedback batch take arrays, so each is compiled (and prepared by
# asyncpg) once, whatever the batch size; a multi-row VALUES is compiled anew per batch. The
# arrays are cast in SQL rather than typed ARRAY binds, whose bind processing walks every element.
#
# The decisions and their endpoints in one round trip: the endpoint's columns come with the
# first decision of each endpoint only (NULL on the others, and endpoint_name NULL on that
# first row when the endpoint is gone), so each endpoint's JSON is decoded once per batch.
# The batch's ids are joined to the primary key, one probe per id. ``decision_id = ANY(:ids)``
# was planned as a sequential scan on a young table (statistics from when it was small), at
# O(rows x ids): 231 ms for a batch of ~650 ids against 11 ms for ~400 this way, and a slow
# lookup under a backlog made the next batches bigger (bench/service-regret/README.md).
_DECISIONS = text(
    "SELECT d.decision_id, d.endpoint, d.arm_id, d.segment, d.features, d.created_at, d.n, "
    "e.name AS endpoint_name, e.policy_kind, e.policy, e.reward_spec, e.decisions_total "
    "FROM (SELECT x.decision_id, x.endpoint, x.arm_id, x.segment, x.features, x.created_at, "
    "row_number() OVER (PARTITION BY x.endpoint) AS n "
    "FROM unnest(CAST(:ids AS text[])) AS i(id) JOIN decisions AS x ON x.decision_id = i.id) AS d "
    "LEFT JOIN endpoints AS e ON e.name = d.endpoint AND d.n = 1"
).columns(policy=JSON, reward_spec=JSON)
# The inserted event ids come back as one array in one row: the driver decodes it in C,
# where a thousand result rows would each cost a Row object.
_DEDUP = text(
    "WITH ins AS (INSERT INTO applied_feedback (event_id, decision_id, reward) "
    "SELECT * FROM unnest(CAST(:event_ids AS text[]), CAST(:decision_ids AS text[]), CAST(:rewards AS float8[])) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id) "
    "SELECT coalesce(array_agg(event_id), CAST('{}' AS text[])) FROM ins"
)

# Every arm's pulls and reward_sum in one statement. The arms are locked in (endpoint, arm_id)
# order first (a FOR UPDATE CTE is never inlined, and the sort sits under its row locks), so
# two replicas' batches lock them in the same order whatever plan the UPDATE's join gets.
_ARM_TOTALS = text(
    "WITH v AS (SELECT * FROM unnest(CAST(:endpoints AS text[]), CAST(:arm_ids AS text[]), "
    "CAST(:pulls AS bigint[]), CAST(:sums AS float8[])) AS u(endpoint, arm_id, n, s)), "
    "locked AS (SELECT a.endpoint, a.arm_id FROM arms AS a JOIN v USING (endpoint, arm_id) "
    "ORDER BY a.endpoint, a.arm_id FOR UPDATE OF a) "
    "UPDATE arms AS a SET pulls = a.pulls + v.n, reward_sum = a.reward_sum + v.s FROM v, locked AS l "
    "WHERE a.endpoint = v.endpoint AND a.arm_id = v.arm_id AND l.endpoint = a.endpoint AND l.arm_id = a.arm_id"
)


# A NamedTuple: immutable like a frozen dataclass, and made per applied event for a third of its
# cost (0.7 against 2.5 us; a batch of 1000 events makes ~1000 of them).
class FeedbackOutcome(NamedTuple):
    applied: bool
    endpoint: str
    arm_id: str
    reward: float


async def _commit_unique(session: AsyncSession, message: str) -> None:
    """Commit; a unique-key clash with a concurrent writer becomes AlreadyExists."""
    try:
        await session.commit()
    except IntegrityError:
        await session.rollback()
        raise AlreadyExists(message) from None


async def create_endpoint(session: AsyncSession, *, spec: EndpointSpec) -> None:
    validate_endpoint(spec)
    if await session.get(EndpointRow, spec.name) is not None:
        raise AlreadyExists(f"endpoint {spec.name!r} already exists")
    policy = spec.policy.to_json()
    kind = policy.pop("kind")
    session.add(
        EndpointRow(
            name=spec.name,
            description=spec.description,
            policy_kind=kind,
            policy=policy,
            reward_spec={"signal_weights": spec.signal_weights, "bounded": spec.bounded},
            incumbent_arm_id="",
        )
    )
    await session.flush()
    session.add_all(_arm_row(spec.name, i, a) for i, a in enumerate(spec.arms))
    await _commit_unique(session, f"endpoint {spec.name!r} already exists")


async def update_endpoint(session: AsyncSession, *, spec: EndpointSpec) -> None:
    """Change description, policy and reward spec; arms are left as they are."""
    check_string(spec.name, "endpoint.name", max_len=ENDPOINT_CHARS, required=True)
    check_string(spec.description, "endpoint.description", max_len=4096)
    row, arms = await endpoint_rows(session, name=spec.name)
    current = PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
    check_policy(spec.policy, n_arms=len(arms), bounded=spec.bounded)
    if LINEAR in (current.kind, spec.policy.kind) and (
        current.kind != spec.policy.kind or current.context_features != spec.policy.context_features
    ):
        raise FailedPrecondition(
            "linear_thompson endpoints keep their kind and context_features; create a new endpoint"
        )
    policy = spec.policy.to_json()
    row.policy_kind = policy.pop("kind")
    row.policy = policy
    row.description = spec.description
    row.reward_spec = {"signal_weights": spec.signal_weights, "bounded": spec.bounded}
    row.updated_at = datetime.now(UTC)
    await session.commit()


def _arm_row(endpoint: str, position: int, arm: ArmSpec) -> ArmRow:
    return ArmRow(
        endpoint=endpoint,
        arm_id=arm.arm_id,
        position=position,
        params=arm.params,
        status=arm.status,
        traffic_cap=arm.traffic_cap,
        pulls=0,
        reward_sum=0.0,
    )


async def endpoint_rows(session: AsyncSession, *, name: str) -> tuple[EndpointRow, list[ArmRow]]:
    if not name:
        raise InvalidArgument("endpoint name is empty")
    row = await session.get(EndpointRow, name)
    if row is None:
        raise NotFound(f"endpoint {name!r} does not exist")
    arms = (await session.scalars(select(ArmRow).where(ArmRow.endpoint == name).order_by(ArmRow.position))).all()
    return row, list(arms)


async def endpoint_names(session: AsyncSession) -> list[str]:
    return list((await session.scalars(select(EndpointRow.name).order_by(EndpointRow.name))).all())


async def add_arm(session: AsyncSession, *, endpoint: str, arm: ArmSpec) -> None:
    _, arms = await endpoint_rows(session, name=endpoint)
    check_arm(arm)
    if any(a.arm_id == arm.arm_id for a in arms):
        raise AlreadyExists(f"arm {arm.arm_id!r} already exists in {endpoint!r}")
    session.add(_arm_row(endpoint, len(arms), arm))
    await _commit_unique(session, f"arm {arm.arm_id!r} already exists in {endpoint!r}")


async def set_arm_status(session: AsyncSession, *, endpoint: str, arm_id: str, status: str) -> None:
    """Retire an arm, or promote a canary to active (the caller commits)."""
    _, arms = await endpoint_rows(session, name=endpoint)
    if arm_id not in {a.arm_id for a in arms}:
        raise NotFound(f"arm {arm_id!r} does not exist in {endpoint!r}")
    if status == RETIRED and all(a.status in (RETIRED, CANARY) or a.arm_id == arm_id for a in arms):
        raise InvalidArgument(f"cannot retire {arm_id!r}: it is the last active arm of {endpoint!r}")
    if status not in (ACTIVE, RETIRED):
        raise InvalidArgument(f"an arm can be set active or retired, not {status!r}")
    await session.execute(
        update(ArmRow)
        .where(ArmRow.endpoint == endpoint, ArmRow.arm_id == arm_id)
        .values(status=status, updated_at=datetime.now(UTC))
    )


async def set_incumbent(session: AsyncSession, *, endpoint: str, arm_id: str) -> None:
    """Remember the incumbent chosen by the stability rule (the caller commits)."""
    await session.execute(update(EndpointRow).where(EndpointRow.name == endpoint).values(incumbent_arm_id=arm_id))


# Not frozen, with slots: made once per event, and a frozen dataclass's __init__ costs twice as much.
@dataclass(slots=True)
class FeedbackItem:
    event_id: str
    decision_id: str
    reward: float | None
    signals: dict[str, float]
    # The endpoint the sender says the decision is from ("" when it does not say): checked.
    endpoint: str = ""


async def apply_feedback(
    session: AsyncSession,
    *,
    event_id: str,
    decision_id: str,
    reward: float | None,
    signals: dict[str, float],
    window: timedelta,
) -> FeedbackOutcome:
    """Apply one feedback event (see :func:`apply_feedback_batch`); raises its error."""
    [outcome] = await apply_feedback_batch(
        session, items=[FeedbackItem(event_id, decision_id, reward, signals)], window=window
    )
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def check_item(item: FeedbackItem) -> None:
    """Raise InvalidArgument when the event cannot be applied whatever its decision."""
    e, d, ep = item.event_id, item.decision_id, item.endpoint
    joined = e + d + ep
    if (
        e
        and d
        and len(e) <= EVENT_ID_CHARS
        and len(d) <= DECISION_ID_CHARS
        and len(ep) <= ENDPOINT_CHARS
        and joined.isascii()
        and "\x00" not in joined
        and not item.signals
        and (item.reward is None or math.isfinite(item.reward))
    ):
        return  # the common case, in a few string operations; anything else is told apart below
    if not item.event_id:
        raise InvalidArgument("feedback has no event id (meta.event_id / feedback_id)")
    if not item.decision_id:
        raise InvalidArgument("feedback has no decision_id")
    # What reaches SQL: ids that fit their columns, no NUL (the gRPC door and the bus handler
    # check the same with their own field names first; this keeps a batch safe from any caller).
    check_string(item.event_id, "event_id", max_len=EVENT_ID_CHARS)
    check_string(item.decision_id, "decision_id", max_len=DECISION_ID_CHARS)
    check_string(item.endpoint, "endpoint", max_len=ENDPOINT_CHARS)
    values = [*([item.reward] if item.reward is not None else []), *item.signals.values()]
    if any(not math.isfinite(v) for v in values):
        raise InvalidArgument("reward and signals must be finite numbers")
    check_numbers(item.signals, "signals")


class NotLoggedYet(Unavailable):
    """Feedback for a decision made moments ago whose row is still in a replica's buffer."""


def _missing_decision(decision_id: str) -> ServiceError:
    age = decision_age_s(decision_id)
    if age is not None and age < DECISION_GRACE_S:
        return NotLoggedYet(f"decision {decision_id!r} is not logged yet; retry shortly")
    return NotFound(f"decision {decision_id!r} is unknown (never logged, or from another deployment)")


class _Decision(NamedTuple):
    """The columns of a decision that its feedback needs (the first six of ``_DECISIONS``)."""

    decision_id: str
    endpoint: str
    arm_id: str
    segment: str
    features: list[float] | None
    created_at: datetime


@dataclass(frozen=True)
class _Target:
    """A decision of the batch that feedback can apply to, with what its endpoint says about
    rewards (looked up once per decision, not per event)."""

    decision: _Decision
    weights: dict[str, float]
    bounded: bool
    kind: str


def _target(
    decision_id: str, decisions: dict[str, _Decision], endpoints: dict[str, Any], now: datetime, window: timedelta
) -> _Target | ServiceError:
    """What feedback for ``decision_id`` applies to, or the error every such event gets."""
    decision = decisions.get(decision_id)
    if decision is None:
        return _missing_decision(decision_id)
    endpoint = endpoints.get(decision.endpoint)
    if endpoint is None:
        return NotFound(f"endpoint {decision.endpoint!r} of decision {decision_id!r} is gone")
    if now - decision.created_at > window:
        return InvalidArgument(f"decision {decision_id!r} is older than the feedback window ({window})")
    spec = endpoint.reward_spec
    return _Target(decision, spec.get("signal_weights", {}), spec.get("bounded", True), endpoint.policy_kind)


CLIPPED = Counter(
    "flywheel_optimizer_rewards_clipped_total",
    "Rewards outside [0, 1] that a bounded endpoint's feedback transaction clipped into it, by side "
    "(below, above): a product sending rewards on another scale (rescale them, or declare signal weights)",
    ["side"],
)
# At most one warning per this many seconds names an endpoint whose rewards were clipped.
CLIP_WARNING_S = 60.0
_clip_warned_at = [-math.inf]


def _reward(item: FeedbackItem, target: _Target) -> float | ServiceError:
    return reward_value(
        item,
        weights=target.weights,
        bounded=target.bounded,
        kind=target.kind,
        clipped=lambda value: _clipped(target.decision.endpoint, value),
    )


def _clipped(endpoint: str, value: float) -> None:
    CLIPPED.labels("below" if value < 0 else "above").inc()
    now = time.monotonic()
    if now - _clip_warned_at[0] >= CLIP_WARNING_S:
        _clip_warned_at[0] = now
        log.warning(
            "a reward outside [0, 1] was clipped by a bounded endpoint (more are counted in "
            "flywheel_optimizer_rewards_clipped_total, warned once a minute)",
            endpoint=endpoint,
            reward=value,
        )


def reward_value(
    item: FeedbackItem,
    *,
    weights: dict[str, float],
    bounded: bool,
    kind: str,
    clipped: Callable[[float], None] | None = None,
) -> float | ServiceError:
    """The event's reward as an endpoint with these reward settings takes it: clipped into
    [0, 1] on a bounded endpoint (``clipped`` is told the value when it was outside), refused
    out of range on an unbounded one."""
    if item.reward is not None and not weights:
        value = item.reward  # a scalar wins (combine_reward), without the call
    else:
        try:
            value = combine_reward(item.reward, item.signals, weights)
        except ValueError as exc:
            return InvalidArgument(str(exc))
    if bounded:
        if clipped is not None and not 0.0 <= value <= 1.0:
            clipped(value)
        return min(1.0, max(0.0, value))
    if not abs(value) <= MAX_ABS_REWARD:  # also NaN/inf from weighting huge signals
        # Refused, not clipped: a clipped 1e300 would still pull the posterior far off.
        return InvalidArgument(
            f"reward: {value:g} is outside [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}], the range an "
            f"unbounded ({kind}) endpoint takes; rescale it"
        )
    return value


async def apply_feedback_batch(
    session: AsyncSession, *, items: list[FeedbackItem], window: timedelta, folds: FoldSink | None = None
) -> list[FeedbackOutcome | ServiceError]:
    """Apply feedback events to their arms' posteriors, each at most once per event id,
    in one transaction with a handful of statements whatever the batch size.

    The dedup rows and the statistics increments commit together, and every counter
    changes by ``x = x + r`` in SQL, so concurrent replicas never lose an update. An
    event's error (invalid, unknown, expired, not logged yet) is returned in its place.

    With ``folds`` (the posterior cache), the transaction also notifies the other replicas of
    its increments (``notify.announce``, delivered only if it commits) and, right after the
    commit, hands them to ``folds.committed`` so this replica's next Select already uses them.
    """
    outcomes: list[FeedbackOutcome | ServiceError | None] = [None] * len(items)
    for i, item in enumerate(items):
        try:
            check_item(item)
        except ServiceError as exc:
            outcomes[i] = exc
    ids = {it.decision_id for i, it in enumerate(items) if outcomes[i] is None}
    rows = (await session.execute(_DECISIONS, {"ids": list(ids)})).all() if ids else []
    # Each decision's columns copied out of its Row once: a Row's attribute costs ~0.5-1 us,
    # a NamedTuple's ~0.04, and the loops below read them several times per event.
    decisions: dict[str, _Decision] = {}
    # name -> a row with the endpoint's policy_kind, policy, reward_spec and decisions_total
    endpoints: dict[str, Any] = {}
    for row in rows:
        d = _Decision._make(row[:6])
        decisions[d.decision_id] = d
        if row[6] == 1 and row[7] is not None:  # n, endpoint_name: its endpoint's columns ride on it
            endpoints[d.endpoint] = row

    # Per decision (a batch holds several events of each), not per event: the endpoint, the
    # feedback window, the reward settings.
    now = datetime.now(UTC)
    targets: dict[str, _Target | ServiceError] = {}
    pending: list[tuple[int, _Target, float]] = []
    for i, item in enumerate(items):
        if outcomes[i] is not None:
            continue
        target = targets.get(item.decision_id)
        if target is None:
            target = targets[item.decision_id] = _target(item.decision_id, decisions, endpoints, now, window)
        if isinstance(target, ServiceError):
            # Its own exception object per event (the same decision's error, not the same instance).
            outcomes[i] = type(target)(*target.args)
            continue
        if item.endpoint and item.endpoint != target.decision.endpoint:
            outcomes[i] = InvalidArgument(
                f"endpoint: the feedback names {item.endpoint!r}, but decision {item.decision_id!r} "
                f"was made by {target.decision.endpoint!r}"
            )
            continue
        value = item.reward
        if value is not None and target.bounded and not target.weights and 0.0 <= value <= 1.0:
            pending.append((i, target, value))  # the common case: what _reward returns, without the call
            continue
        value = _reward(item, target)
        if isinstance(value, ServiceError):
            outcomes[i] = value
            continue
        pending.append((i, target, value))

    applied_ids: set[str] = set()
    if pending:
        result = await session.execute(
            _DEDUP,
            {
                "event_ids": [items[i].event_id for i, _, _ in pending],
                "decision_ids": [t.decision.decision_id for _, t, _ in pending],
                "rewards": [v for _, _, v in pending],
            },
        )
        applied_ids = set(result.scalar_one())

    # The applied rewards summed per decision first ([n, sum r, sum r^2]): every event of a
    # decision goes to the same arm, segment and features.
    sums: dict[str, list[float]] = {}
    shared: dict[tuple[bool, str, float], FeedbackOutcome] = {}  # frozen: one object per distinct outcome
    for i, target, value in pending:
        event_id = items[i].event_id
        applied = event_id in applied_ids
        applied_ids.discard(event_id)  # a repeat inside the same batch is a duplicate too
        d = target.decision
        key = (applied, d.decision_id, value)
        outcome = shared.get(key)
        if outcome is None:
            outcome = shared[key] = FeedbackOutcome(applied=applied, endpoint=d.endpoint, arm_id=d.arm_id, reward=value)
        outcomes[i] = outcome
        if applied:
            acc = sums.get(d.decision_id)
            if acc is None:
                sums[d.decision_id] = [1.0, value, value * value]
            else:
                acc[0] += 1.0
                acc[1] += value
                acc[2] += value * value
    # Then per (endpoint, arm, segment) as plain floats, and per arm for the counters; only a
    # decision with features (linear endpoints) costs an Increment.add_sums (its outer product).
    plain: dict[tuple[str, str, str], list[float]] = {}
    increments: dict[tuple[str, str, str], stats.Increment] = defaultdict(stats.Increment)
    totals: dict[tuple[str, str], stats.Increment] = defaultdict(stats.Increment)
    for decision_id, (n, s, ss) in sums.items():
        d = decisions[decision_id]
        features = d.features
        keys = [(d.endpoint, d.arm_id, "")]
        if d.segment:
            keys.append((d.endpoint, d.arm_id, d.segment))
        if features is not None:
            for key in keys:
                increments[key].add_sums(n, s, ss, features)
        else:
            for key in keys:
                acc = plain.get(key)
                if acc is None:
                    plain[key] = [n, s, ss]
                else:
                    acc[0] += n
                    acc[1] += s
                    acc[2] += ss
    for key, (n, s, ss) in plain.items():
        increments[key].add_sums(n, s, ss, None)
    for (endpoint, arm_id, segment), inc in increments.items():
        if not segment:
            totals[(endpoint, arm_id)].add_sums(inc.w, inc.s, inc.ss, None)
    # Sorted, so two replicas lock rows in the same order and cannot deadlock. One statement
    # per endpoint for the statistics (its policy sets the decay), one for all arms' counters.
    by_endpoint: dict[str, list[tuple[str, str, stats.Increment]]] = defaultdict(list)
    for (endpoint, arm_id, segment), inc in sorted(increments.items()):
        by_endpoint[endpoint].append((arm_id, segment, inc))
    for endpoint, rows in by_endpoint.items():
        row = endpoints[endpoint]
        policy = PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
        await stats.add_many(session, endpoint=endpoint, policy=policy, increments=rows)
    if totals:
        keys = sorted(totals)
        await session.execute(
            _ARM_TOTALS,
            {
                "endpoints": [e for e, _ in keys],
                "arm_ids": [a for _, a in keys],
                "pulls": [int(totals[k].w) for k in keys],
                "sums": [totals[k].s for k in keys],
            },
        )
    clocks = {name: float(getattr(row, "decisions_total", 0) or 0) for name, row in endpoints.items()}
    # Every event this transaction settles (applied, a duplicate, or refused for good): a replica
    # that folded one provisionally drops that fold when it learns of the commit.
    settled = (
        [it for it, o in zip(items, outcomes, strict=True) if type(o) is FeedbackOutcome or _final(o)]
        if folds is not None and folds.tracks_provisional
        else []
    )
    batch = (
        await _announce(session, folds, increments, clocks, settled)
        if folds is not None and (increments or settled)
        else None
    )
    await session.commit()
    if batch is not None and folds is not None:
        try:
            folds.committed(batch)
        except Exception as exc:  # noqa: BLE001 - committed already; the next refresh reads it
            log.warning("could not fold committed feedback", error=repr(exc))
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def _final(outcome: object) -> bool:
    """An event's error that no redelivery changes (its provisional fold is dropped)."""
    return isinstance(outcome, InvalidArgument | NotFound)


class FoldSink(Protocol):
    """Who learns of committed increments at once (``cache.PosteriorCache``)."""

    # This replica's id in its notifications to the others ("" sends none).
    replica: str

    # Whether replicas fold feedback provisionally (``provisional.py``): then each transaction
    # also says which event ids it settled.
    @property
    def tracks_provisional(self) -> bool: ...

    # Whether other replicas may hold this one's provisional folds (``peer_folds.py``): then
    # its transactions name every event they settle, not only other replicas' decisions'.
    @property
    def shares_provisional(self) -> bool: ...

    def decided_here(self, decision_id: str) -> bool: ...

    def committed(self, batch: FoldBatch) -> None: ...


async def _announce(
    session: AsyncSession,
    folds: FoldSink,
    increments: dict[tuple[str, str, str], stats.Increment],
    clocks: dict[str, float],
    settled: list[FeedbackItem],
) -> FoldBatch:
    endpoint_wide: dict[str, dict[str, stats.Increment]] = defaultdict(dict)
    segments = {}
    for (endpoint, arm_id, segment), inc in increments.items():
        if segment:
            segments[(endpoint, arm_id, segment)] = inc
        else:
            endpoint_wide[endpoint][arm_id] = inc
    clocks = {e: clocks.get(e, 0.0) for e in endpoint_wide}
    # The other replicas hear only of the events whose decisions this one did not make (the
    # provisional fold of one it made is its own, dropped right after the commit), unless it
    # told them of its folds: then of every event.
    shared = folds.shares_provisional
    elsewhere = [it.event_id for it in settled if shared or not folds.decided_here(it.decision_id)]
    xid, at = await notify.announce(
        session, replica=folds.replica or None, endpoints=endpoint_wide, clocks=clocks, settled=elsewhere
    )
    return FoldBatch(
        xid=xid,
        at=at,
        endpoints=dict(endpoint_wide),
        segments=segments,
        clocks=clocks,
        settled=tuple(it.event_id for it in settled),
    )
