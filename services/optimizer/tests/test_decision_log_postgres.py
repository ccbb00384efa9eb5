"""DecisionLog's write on a real PostgreSQL (the bus is a fake that records what it was given):
a flush COPYs exactly the rows it was given, every column as the decision had it, and advances
each endpoint's decision clock by them; a flush that failed after its rows committed (the bus
was down) is retried without a duplicate row or a decision counted twice; a row already there
sends a first try down the path that skips it; a row PostgreSQL refuses is dead-lettered and
the rest are written and counted."""

from __future__ import annotations

import json
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
    fields = {"arm_id": "a", "probability": 0.25, **fields}
    return Decision(decision_id=new_decision_id(), endpoint=endpoint, params={}, **fields)  # type: ignore[arg-type]


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


async def test_contexts_are_stored_as_written_and_odd_values_as_before(engine):
    """The rows travel as JSON since issue 20: a context keeps its text (key order, nulls,
    escapes), features keep [] apart from NULL, a naive created_at is local time and a
    non-finite probability is stored, as the parameter arrays stored them."""
    log = new_log(engine, Publisher())
    contexts = [
        {"z": 1, "a": None, "ü": "☃", "q": "'\"\\", "nested": {"b": [None, 1.5], "a": {}}},
        {},
        {"n": None},
    ]
    made = [decision(context=c, features=f) for c, f in zip(contexts, ([], None, [1.5, 2.0]), strict=True)]
    naive = datetime(2026, 11, 25, 3, 4, 5, 678901)  # no tzinfo
    made.append(decision(created_at=naive))
    made += [decision(probability=p) for p in (float("nan"), float("inf"), float("-inf"))]
    log.record_many(made)
    assert await log.flush() == len(made)
    async with engine.connect() as conn:
        found = await conn.execute(
            text("SELECT decision_id, context::text, features, created_at, probability::text FROM decisions")
        )
        stored = {r[0]: r[1:] for r in found}
    for d in made[:3]:
        assert stored[d.decision_id][0] == json.dumps(d.context)  # the text json.dumps wrote, not jsonb's
        assert stored[d.decision_id][1] == d.features
    assert stored[made[3].decision_id][2] == naive.astimezone(UTC)
    assert [stored[d.decision_id][3] for d in made[4:]] == ["NaN", "Infinity", "-Infinity"]
    assert await clocks(engine) == {"e1": len(made), "e2": 0}


async def test_rows_that_json_or_postgresql_cannot_take_are_dead_lettered_and_the_rest_written(engine):
    publisher = Publisher()
    log = new_log(engine, publisher)
    good = [decision() for _ in range(20)]
    bad = [
        decision(features=[1.0, float("nan")]),  # JSON has no NaN: the server refuses it
        decision(context={"x": float("nan")}),  # a Struct may hold NaN; a json column may not
        decision(arm_id="x" * 200),  # longer than the column
        decision(session_id="s\x00"),  # jsonb, like text, holds no NUL
    ]
    log.record_many([*good[:7], bad[0], *good[7:12], bad[1], bad[2], *good[12:], bad[3]])
    assert await log.flush() == 24
    assert set(await rows(engine)) == {d.decision_id for d in good}
    assert await clocks(engine) == {"e1": 20, "e2": 0}
    assert sorted(publisher.letters) == sorted(f"optimizer-decision-log:{d.decision_id}" for d in bad)


async def test_a_decision_for_an_endpoint_not_in_the_table_is_written_and_counts_on_no_clock(engine):
    """Decisions have no foreign key to endpoints (one deleted meanwhile keeps its log): its rows
    go in, and the clocks of the others advance by their own rows, on a first try and a retry."""
    log = new_log(engine, Publisher())
    made = [decision("e1"), decision("gone"), decision("e2"), decision("gone")]
    log.record_many(made)
    assert await log.flush() == 4
    assert set(await rows(engine)) == {d.decision_id for d in made}
    assert await clocks(engine) == {"e1": 1, "e2": 1}
    again = [made[0], decision("gone"), decision("e2")]  # one written already: the retry's INSERT
    assert await log._insert(again) == []
    assert len(await rows(engine)) == 6
    assert await clocks(engine) == {"e1": 1, "e2": 2}


async def test_a_decision_id_twice_in_one_batch_is_written_and_counted_once(engine):
    log = new_log(engine, Publisher())
    first = decision()
    twin = Decision(decision_id=first.decision_id, endpoint="e1", arm_id="b", params={}, probability=0.5)
    others = [decision("e2") for _ in range(3)]
    log.record_many([first, *others, twin])
    assert await log.flush() == 5
    stored = await rows(engine)
    assert set(stored) == {first.decision_id, *(d.decision_id for d in others)}
    assert await clocks(engine) == {"e1": 1, "e2": 3}
