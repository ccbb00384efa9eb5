"""The SQL cost of one feedback batch, pinned (issue 20), on a real PostgreSQL.

`service.apply_feedback_batch` issues a fixed number of statements whatever the batch's
size and however many arms and segments it touches: the arms counters and the statistics
increments are one statement each, over arrays. The statistics it writes are still exactly
the sums of the applied rewards (and, for a linear endpoint, of x x^T and r x).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import event, text

from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.core.db import create_engine, session_factory
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer import service
from flywheel.optimizer.convert import endpoint_spec
from flywheel.optimizer.decisions import new_decision_id
from flywheel.optimizer.models import DecisionRow
from flywheel.optimizer.service import FeedbackItem
from flywheel.stack.testing import migrate_in_process as migrate

from .helpers import three_arm_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# decisions (with their endpoints, one statement), dedup insert, arms update; then one
# arm_stats upsert per endpoint (this batch touches 2, with 3 arms and 3 segments each: 18
# rows, 6 arms). Without folds there is no announce. (It was 19 statements here before issue
# 20: one per row and arm; 4 + 2 before issue 19 read the endpoints by themselves.)
STATEMENTS_PER_BATCH = 3 + 2
ARMS = ("small", "large", "creative")


async def test_a_batch_costs_a_fixed_number_of_statements_and_adds_exact_sums(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = session_factory(engine)
    statements: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    try:
        plain = three_arm_endpoint("plain")
        linear = three_arm_endpoint("lin")
        linear.endpoint.policy.CopyFrom(
            ep_pb.PolicySpec(kind=ep_pb.POLICY_KIND_LINEAR_THOMPSON, context_features=["bias", "x"])
        )
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(plain.endpoint))
        async with sessions() as session:
            await service.create_endpoint(session, spec=endpoint_spec(linear.endpoint))

        rng = np.random.default_rng(7)
        rows = []
        for n in range(60):
            endpoint = "lin" if n % 2 else "plain"
            features = [1.0, float(rng.normal())] if endpoint == "lin" else None
            rows.append(
                DecisionRow(
                    decision_id=new_decision_id(),
                    endpoint=endpoint,
                    arm_id=ARMS[n % 3],
                    segment=("lang=en", "lang=fr", "")[n % 3 if n % 5 else 2],
                    features=features,
                    probability=0.5,
                    created_at=datetime.now(UTC),
                )
            )
        async with sessions() as session:
            session.add_all(rows)
            await session.commit()
        rewards = {r.decision_id: float(rng.uniform()) for r in rows}

        async def batch(decisions: list[DecisionRow], repeat: bool = False) -> int:
            items = [FeedbackItem(f"fb-{d.decision_id}", d.decision_id, rewards[d.decision_id], {}) for d in decisions]
            if repeat:
                items += items[:3]  # duplicates inside the batch: applied once
            statements.clear()
            async with sessions() as session:
                outcomes = await service.apply_feedback_batch(session, items=items, window=timedelta(days=1))
            assert sum(o.applied for o in outcomes) == len(decisions)
            return len(statements)

        assert await batch(rows[:30], repeat=True) == STATEMENTS_PER_BATCH
        assert await batch(rows[30:]) == STATEMENTS_PER_BATCH
        # A batch of duplicates only: nothing applied, fewer statements.
        statements.clear()
        async with sessions() as session:
            outcomes = await service.apply_feedback_batch(
                session,
                items=[FeedbackItem(f"fb-{rows[0].decision_id}", rows[0].decision_id, 1.0, {})],
                window=timedelta(days=1),
            )
        assert not outcomes[0].applied and len(statements) <= STATEMENTS_PER_BATCH

        async with sessions() as session:
            stored = {
                (r.endpoint, r.arm_id, r.segment): r
                for r in await session.execute(
                    text("SELECT endpoint, arm_id, segment, w, s, ss, xtx, xty FROM arm_stats")
                )
            }
            arms = {
                (r.endpoint, r.arm_id): r
                for r in await session.execute(text("SELECT endpoint, arm_id, pulls, reward_sum FROM arms"))
            }
        expected: dict[tuple[str, str, str], list] = {}
        for d in rows:
            r = rewards[d.decision_id]
            for segment in {"", d.segment}:
                e = expected.setdefault((d.endpoint, d.arm_id, segment), [0.0, 0.0, 0.0, 0.0, 0.0])
                e[0] += 1
                e[1] += r
                e[2] += r * r
                if d.features is not None:
                    x = np.asarray(d.features)
                    e[3] = e[3] + np.outer(x, x)
                    e[4] = e[4] + r * x
        assert set(stored) == set(expected)
        for key, (w, s, ss, xtx, xty) in expected.items():
            row = stored[key]
            assert (row.w, row.s, row.ss) == pytest.approx((w, s, ss)), key
            if key[0] == "lin":
                assert np.asarray(row.xtx) == pytest.approx(np.ravel(xtx)), key
                assert np.asarray(row.xty) == pytest.approx(xty), key
            else:
                assert row.xtx is None and row.xty is None
        for (endpoint, arm_id), row in arms.items():
            mine = [rewards[d.decision_id] for d in rows if (d.endpoint, d.arm_id) == (endpoint, arm_id)]
            assert row.pulls == len(mine) and row.reward_sum == pytest.approx(sum(mine))
    finally:
        await engine.dispose()
