"""Reading and incrementing ``arm_stats`` in SQL.

Every change is one ``INSERT ... ON CONFLICT DO UPDATE`` whose new values are computed
from the row's current values inside PostgreSQL, so concurrent replicas never lose an
update. Time is the database's ``now()``, one clock for every replica; the decision clock is
the endpoint's ``decisions_total``, read in the same statement. Discounted endpoints decay the
stored evidence by 0.5^(elapsed / half_life) as they add to it (policies/drift.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.optimizer.policies.drift import decay_factor
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import PolicyConfig


def evidence_factor(policy: PolicyConfig, *, elapsed_s: float, elapsed_decisions: float) -> float:
    """The factor by which an endpoint's stored evidence shrinks between two moments that are
    ``elapsed_s`` seconds and ``elapsed_decisions`` of the endpoint's decisions apart.

    0.5 ** (elapsed_s / half_life_s) or 0.5 ** (elapsed_decisions / half_life_decisions),
    whichever half-life the policy sets; 1.0 without one (windows are not a factor: they drop
    whole buckets). Multiply every evidence statistic (w, s, ss, xtx, xty) by it, never the prior.
    """
    return decay_factor(elapsed_s, policy.half_life_s) * decay_factor(elapsed_decisions, policy.half_life_decisions)


# The endpoint's decision clock, read inside the statement that uses it (a scalar subquery):
# the number of its decisions the DecisionLog has written so far.
# (Its own parameter: PostgreSQL deduces :endpoint's type from the column it is inserted into.)
_CLOCK = "coalesce((SELECT decisions_total FROM endpoints WHERE name = :clock_of), 0)"


def _decay(policy: PolicyConfig) -> str:
    """SQL for the factor that brings the stored row ``st`` to the incoming one (``EXCLUDED``)."""
    if policy.half_life_s > 0:
        elapsed = "greatest(0.0, extract(epoch from (EXCLUDED.as_of - st.as_of)))"
        return f"power(0.5, {elapsed} / {float(policy.half_life_s)!r})"
    if policy.half_life_decisions > 0:
        elapsed = "greatest(0, EXCLUDED.as_of_decisions - st.as_of_decisions)::float8"
        return f"power(0.5, {elapsed} / {float(policy.half_life_decisions)!r})"
    return "1.0"


def _bucket(policy: PolicyConfig) -> str:
    if policy.bucket_s > 0:
        return f"(floor(extract(epoch from now()) / {policy.bucket_s}) * {policy.bucket_s})::bigint"
    if policy.bucket_decisions > 0:  # integer division of a bigint: the bucket's first decision
        return f"({_CLOCK} / {policy.bucket_decisions} * {policy.bucket_decisions})::bigint"
    return "0"


def _array_update(column: str, factor: str) -> str:
    # Column names are constants of this module and factor a formatted float: no user input.
    return (
        f"CASE WHEN EXCLUDED.{column} IS NULL THEN st.{column} ELSE "  # noqa: S608
        f"(SELECT array_agg(coalesce(a, 0) * {factor} + b ORDER BY i) "
        f"FROM unnest(st.{column}, EXCLUDED.{column}) WITH ORDINALITY AS t(a, b, i)) END"
    )


@dataclass
class Increment:
    """What a batch of rewards adds to one arm's statistics (in one segment)."""

    w: float = 0.0
    s: float = 0.0
    ss: float = 0.0
    xtx: np.ndarray | None = None
    xty: np.ndarray | None = None

    def add(self, reward: float, features: list[float] | None) -> None:
        self.w += 1.0
        self.s += reward
        self.ss += reward * reward
        if features is not None:
            x = np.asarray(features, dtype=float)
            self.xtx = np.outer(x, x) if self.xtx is None else self.xtx + np.outer(x, x)
            self.xty = reward * x if self.xty is None else self.xty + reward * x

    def add_sums(self, n: float, s: float, ss: float, features: list[float] | None) -> None:
        """``n`` rewards at once, summing to ``s`` (their squares to ``ss``), all with the same
        ``features``: what ``n`` calls of `add` give, with one outer product instead of ``n``."""
        self.w += n
        self.s += s
        self.ss += ss
        if features is not None:
            x = np.asarray(features, dtype=float)
            xtx = n * np.outer(x, x)
            self.xtx = xtx if self.xtx is None else self.xtx + xtx
            self.xty = s * x if self.xty is None else self.xty + s * x


async def add(
    session: AsyncSession, *, endpoint: str, arm_id: str, segment: str, policy: PolicyConfig, inc: Increment
) -> None:
    """Add an increment to one arm's statistics (one segment; '' is endpoint-wide)."""
    await add_many(session, endpoint=endpoint, policy=policy, increments=[(arm_id, segment, inc)])


def _array_literal(values: np.ndarray | None) -> str | None:
    # A PostgreSQL array literal; repr() writes each float so that it reads back exactly.
    return None if values is None else "{" + ",".join(repr(float(v)) for v in values.ravel()) + "}"


async def add_many(
    session: AsyncSession, *, endpoint: str, policy: PolicyConfig, increments: list[tuple[str, str, Increment]]
) -> None:
    """Add increments to several (arm, segment) rows of one endpoint in one statement.

    The rows are written in the order given (sort them, so that two replicas lock rows in the
    same order); each (arm, segment) may appear once. Each row gets exactly what `add` gives it:
    the same decay of the stored row, bucket and decision clock."""
    if not increments:
        return
    factor = _decay(policy)
    sql = text(f"""
        INSERT INTO arm_stats AS st (endpoint, arm_id, segment, bucket, w, s, ss, xtx, xty, as_of, as_of_decisions)
        SELECT :endpoint, v.arm_id, v.segment, {_bucket(policy)}, v.w, v.s, v.ss,
               v.xtx::float8[], v.xty::float8[], now(), {_CLOCK}
        FROM unnest(CAST(:arm_ids AS text[]), CAST(:segments AS text[]), CAST(:ws AS float8[]),
                    CAST(:ss AS float8[]), CAST(:sss AS float8[]), CAST(:xtxs AS text[]), CAST(:xtys AS text[]))
             WITH ORDINALITY AS v(arm_id, segment, w, s, ss, xtx, xty, i)
        ORDER BY v.i
        ON CONFLICT (endpoint, arm_id, segment, bucket) DO UPDATE SET
            w = st.w * {factor} + EXCLUDED.w,
            s = st.s * {factor} + EXCLUDED.s,
            ss = st.ss * {factor} + EXCLUDED.ss,
            xtx = {_array_update("xtx", factor)},
            xty = {_array_update("xty", factor)},
            as_of = greatest(st.as_of, EXCLUDED.as_of),
            as_of_decisions = greatest(st.as_of_decisions, EXCLUDED.as_of_decisions)
    """)  # noqa: S608 - only numbers from validated settings are formatted in
    await session.execute(
        sql,
        {
            "endpoint": endpoint,
            "clock_of": endpoint,
            "arm_ids": [a for a, _, _ in increments],
            "segments": [g for _, g, _ in increments],
            "ws": [i.w for _, _, i in increments],
            "ss": [i.s for _, _, i in increments],
            "sss": [i.ss for _, _, i in increments],
            "xtxs": [_array_literal(i.xtx) for _, _, i in increments],
            "xtys": [_array_literal(i.xty) for _, _, i in increments],
        },
    )


def aggregate(policy: PolicyConfig, arm_ids: list[str], rows: list[Any], now: datetime, d: int = 0) -> Stats:
    """Fold stored rows (one segment, any buckets) into per-arm statistics as of ``now`` and of
    each row's ``clock`` (its endpoint's decision clock when it was read, see `load_rows`)."""
    index = {a: i for i, a in enumerate(arm_ids)}
    out = Stats.zeros(len(arm_ids), d)
    horizon = now.timestamp() - policy.window_s if policy.window_s > 0 else None
    for row in rows:
        i = index.get(row.arm_id)
        if i is None or (horizon is not None and row.bucket + policy.bucket_s <= horizon):
            continue
        clock = row.clock or 0
        if policy.window_decisions > 0 and not _in_decision_window(policy, row.bucket, clock):
            continue
        f = evidence_factor(
            policy,
            elapsed_s=(now - row.as_of).total_seconds(),
            elapsed_decisions=clock - row.as_of_decisions,
        )
        out.w[i] += f * row.w
        out.s[i] += f * row.s
        out.ss[i] += f * row.ss
        if d and row.xtx is not None and out.xtx is not None and out.xty is not None:
            out.xtx[i] += f * np.asarray(row.xtx).reshape(d, d)
            out.xty[i] += f * np.asarray(row.xty)
    return out


def _in_decision_window(policy: PolicyConfig, bucket: int, clock: int) -> bool:
    """Whether a bucket (its first decision) still counts at ``clock``. A bucket beyond the
    clock is not one of this window's (left by an earlier time window): it never counts."""
    return clock - policy.window_decisions < bucket + policy.bucket_decisions and bucket <= clock


async def load_rows(
    session: AsyncSession, *, endpoint: str | None = None, segment: str = ""
) -> tuple[list[Any], datetime]:
    """Stats rows of one segment (of one endpoint, or all), and the database's now().

    Each row carries ``clock``, its endpoint's decision clock (``decisions_total``) read in the
    same statement, which `aggregate` decays ``as_of_decisions`` to."""
    where = "st.segment = :segment" + (" AND st.endpoint = :endpoint" if endpoint else "")
    result = await session.execute(
        text(
            "SELECT st.endpoint, st.arm_id, st.bucket, st.w, st.s, st.ss, st.xtx, st.xty, st.as_of, "  # noqa: S608
            "st.as_of_decisions, e.decisions_total AS clock "
            f"FROM arm_stats st JOIN endpoints e ON e.name = st.endpoint WHERE {where}"
        ),
        {"segment": segment, "endpoint": endpoint},
    )
    rows = list(result)
    now = (await session.execute(text("SELECT now()"))).scalar_one()
    return rows, now


async def drop_expired_buckets(session: AsyncSession, *, endpoint: str, policy: PolicyConfig) -> None:
    """Delete window buckets that can no longer count."""
    if policy.window_decisions > 0:
        # Every bucket of a decision window is one (the first starts at decision 0).
        await session.execute(
            text(f"DELETE FROM arm_stats WHERE endpoint = :endpoint AND bucket + :bd <= {_CLOCK} - :window"),  # noqa: S608
            {
                "endpoint": endpoint,
                "clock_of": endpoint,
                "bd": policy.bucket_decisions,
                "window": policy.window_decisions,
            },
        )
    elif policy.window_s > 0:
        await session.execute(
            text(
                "DELETE FROM arm_stats WHERE endpoint = :e AND bucket > 0 "
                "AND bucket + :bs <= extract(epoch from now()) - :window"
            ),
            {"e": endpoint, "bs": policy.bucket_s, "window": policy.window_s},
        )
