"""DecisionLog's write on a real PostgreSQL (the bus is a fake that records what it was given):
a flush COPYs exactly the rows it was given, every column as the decision had it, and advances
each endpoint's decision clock by them; a flush that failed after its rows committed (the bus
was down) is retried without a duplicate row or a decision counted twice; a row already there
sends a first try down the path that skips it; a row PostgreSQL refuses is dead-lettered and
the rest are written and counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text

from flywheel.api.subjects import Catalogue
from flywheel.core.db import create_engine
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer.decisions import Decision, DecisionLog, new_decision_id
from flywheel.optimizer.models import EndpointRow
from flywheel.stack.testing import migrate_in_process as migrate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Publisher:
    """Records published event ids; ``down`` makes publish_many fail as an unreachable NATS does."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.letters: list[str] = []
        self.down = False

    async def publish_many(self, items: list) -> None:
        if self.down:
            raise TimeoutError("nats: timeout")
        self.messages.extend(event_id for _subject, _message, event_id in items)

    async def publish(self, _subject: str, _message: object, *, msg_id: str) -> None:
        self.letters.append(msg_id)


@pytest.fixture
async def engine(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    async with engine.begin() as conn:
        await conn.execute(
            insert(EndpointRow),
            [{"name": n, "policy_kind": "beta", "policy": {}, "reward_spec": {}} for n in ("e1", "e2")],
        )
    try:
        yield engine
    finally:
        for log in LOGS:
            await log.close()  # gives its held connection back
        LOGS.clear()
        await engine.dispose()


LOGS: list[DecisionLog] = []


def new_log(engine, publisher: Publisher) -> DecisionLog:
    LOGS.append(DecisionLog(engine, publisher, Catalogue("t")))  # type: ignore[arg-type]
    return LOGS[-1]


def decision(endpoint: str = "e1", **fields: object) -> Decision:
    return Decision(decision_id=new_decision_id(), endpoint=endpoint, arm_id="a", params={}, probability=0.25, **fields)  # type: ignore[arg-type]


async def rows(engine) -> dict[str, tuple]:
    async with engine.connect() as conn:
        found = await conn.execute(
            text(
                "SELECT decision_id, endpoint, arm_id, probability, user_id, session_id, segment, context, "
                "features, sticky, created_at FROM decisions"
            )
        )
        return {r[0]: tuple(r) for r in found}


async def clocks(engine) -> dict[str, int]:
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT name, decisions_total FROM endpoints"))
        return {name: total for name, total in found}


async def test_a_flush_copies_exactly_its_rows_and_advances_each_decision_clock(engine):
    log = new_log(engine, Publisher())
    moment = datetime(2026, 11, 25, 1, 2, 3, 456789, tzinfo=UTC)
    special = decision(
        "e2",
        user_id="ü-1 ☃",
        session_id="s'1\"",
        segment="fr",
        context={"lang": "fr", "n": 3.5, "nested": {"list": [1, "two", None, True]}, "quote": 'a"b\\c'},
        features=[0.5, -1.0, 1e-300],
        sticky=True,
        created_at=moment,
    )
    plain = [decision() for _ in range(300)]
    for d in [*plain[:100], special, *plain[100:]]:
        log.record(d)
    assert await log.flush() == 301
    stored = await rows(engine)
    assert len(stored) == 301
    assert stored[special.decision_id] == (
        special.decision_id,
        "e2",
        "a",
        0.25,
        "ü-1 ☃",
        "s'1\"",
        "fr",
        special.context,
        [0.5, -1.0, 1e-300],
        True,
        moment,
    )
    for d in plain:
        row = stored[d.decision_id]
        assert row[1:10] == ("e1", "a", 0.25, "", "", "", {}, None, False)
        assert abs(row[10] - d.created_at) < timedelta(microseconds=1)
    assert await clocks(engine) == {"e1": 300, "e2": 1}


async def test_a_flush_that_failed_after_its_rows_committed_is_retried_without_duplicates(engine):
    publisher = Publisher()
    log = new_log(engine, publisher)
    made = [decision("e1" if k % 3 else "e2") for k in range(90)]
    log.record_many(made)
    publisher.down = True  # the rows commit, then the bus fails: the whole batch is retried
    with pytest.raises(TimeoutError):
        await log.flush()
    assert len(await rows(engine)) == 90 and log.pending == 90
    publisher.down = False
    later = [decision() for _ in range(10)]
    log.record_many(later)
    assert await log.flush() == 100
    assert set(await rows(engine)) == {d.decision_id for d in made + later}
    assert await clocks(engine) == {"e1": 60 + 10, "e2": 30}  # each decision counted once
    assert publisher.messages and log.pending == 0


async def test_a_first_try_meeting_a_row_already_written_skips_it_and_counts_the_rest(engine):
    log = new_log(engine, Publisher())
    first = [decision() for _ in range(5)]
    log.record_many(first)
    await log.flush()
    again = [*first[2:], *(decision() for _ in range(4))]  # 3 already there, 4 new
    assert await log._insert(again) == []
    assert len(await rows(engine)) == 9
    assert await clocks(engine) == {"e1": 9, "e2": 0}


async def test_a_row_postgresql_refuses_is_dead_lettered_and_the_rest_written_and_counted(engine):
    publisher = Publisher()
    log = new_log(engine, publisher)
    good = [decision() for _ in range(64)]
    bad = decision(user_id="x\x00")
    log.record_many([*good[:30], bad, *good[30:]])
    assert await log.flush() == 65
    assert set(await rows(engine)) == {d.decision_id for d in good}
    assert await clocks(engine) == {"e1": 64, "e2": 0}
    assert publisher.letters == [f"optimizer-decision-log:{bad.decision_id}"]
