"""DecisionLog's flusher: it sleeps while there is nothing to write, and a decision recorded from
a worker thread of the sync gRPC server wakes it (no lost wake-up). The real PostgreSQL and
JetStream path is covered by tests/integration/test_decision_batches.py; here both are fakes
that record what they were given."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from datetime import timedelta

import asyncpg
import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import DeadLetter
from flywheel.api.subjects import Catalogue
from flywheel.core.errors import ResourceExhausted
from flywheel.optimizer import handlers
from flywheel.optimizer.decisions import Decision, DecisionLog, new_decision_id
from flywheel.optimizer.service import FeedbackItem, FeedbackOutcome, NotLoggedYet


class FakeDriver:
    """The asyncpg connection's part the log uses: a first try's INSERT fails whole on a decision
    id already written, as the primary key makes it; a retry's INSERT skips those rows."""

    def __init__(self) -> None:
        self.inserted: list[str] = []
        self.statements = 0
        self.retries = 0  # statements of the retry's kind (ON CONFLICT DO NOTHING)

    def check(self, user_ids: list[str]) -> None:
        """Raise as PostgreSQL would for these rows (subclasses refuse some)."""

    async def execute(self, _sql: str, rows: str, *_rest: object) -> None:
        self.statements += 1
        parsed = json.loads(rows)  # the rows as the log sends them: one JSON array, a row an array
        ids: list[str] = [row[0] for row in parsed]
        self.check([row[4] for row in parsed])
        if "ON CONFLICT" in _sql:
            self.retries += 1
            self.inserted.extend(i for i in ids if i not in self.inserted)
            return
        if set(ids) & set(self.inserted):
            raise asyncpg.exceptions.UniqueViolationError("duplicate key value violates unique constraint")
        self.inserted.extend(ids)


class FakeConnection:
    def __init__(self, driver: FakeDriver) -> None:
        self.driver_connection = driver

    async def get_raw_connection(self) -> FakeConnection:
        return self

    async def close(self) -> None:
        return None


class FakeEngine:
    def __init__(self) -> None:
        self.driver = FakeDriver()

    async def connect(self) -> FakeConnection:
        return FakeConnection(self.driver)


class FakePublisher:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def publish_many(self, items: list) -> None:
        self.messages.extend(event_id for _subject, _message, event_id in items)


class CountingLog(DecisionLog):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.flushes = 0

    async def flush(self) -> int:
        self.flushes += 1
        return await super().flush()


def decision() -> Decision:
    return Decision(decision_id=new_decision_id(), endpoint="e", arm_id="a", params={}, probability=1.0)


async def wait_for(predicate, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.005)
    return predicate()


async def test_an_idle_log_sleeps_and_a_decision_from_a_worker_thread_wakes_it():
    engine, publisher = FakeEngine(), FakePublisher()
    log = CountingLog(engine, publisher, Catalogue("t"), flush_interval_s=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(log.run())
    try:
        await asyncio.sleep(0.2)  # 20 intervals with nothing to write
        assert log.flushes == 0
        for round_ in range(3):  # each time from idle: the first decision must start the timer
            made = [decision() for _ in range(5)]
            worker = threading.Thread(target=lambda made=made: [log.record(d) for d in made])
            worker.start()
            worker.join()
            assert await wait_for(lambda made=made: set(d.decision_id for d in made) <= set(engine.driver.inserted))
            flushes = log.flushes
            await asyncio.sleep(0.1)
            assert log.flushes == flushes, f"round {round_}: the log kept waking with nothing to write"
        assert len(engine.driver.inserted) == 15 and len(publisher.messages) == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_full_buffer_is_written_before_the_interval_ends():
    engine, publisher = FakeEngine(), FakePublisher()
    log = DecisionLog(engine, publisher, Catalogue("t"), flush_interval_s=5.0, max_batch=10)  # type: ignore[arg-type]
    task = asyncio.create_task(log.run())
    try:
        await asyncio.sleep(0.05)
        threading.Thread(target=lambda: [log.record(decision()) for _ in range(10)]).start()
        assert await wait_for(lambda: len(engine.driver.inserted) == 10, timeout_s=1.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class PickyDriver(FakeDriver):
    """Refuses a whole statement when any row holds a NUL byte in user_id, as PostgreSQL does."""

    def check(self, user_ids: list[str]) -> None:
        if any("\x00" in u for u in user_ids):
            raise asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00')


class LetterPublisher(FakePublisher):
    def __init__(self) -> None:
        super().__init__()
        self.letters: list[tuple[str, DeadLetter, str]] = []

    async def publish(self, subject: str, message: DeadLetter, *, msg_id: str) -> None:
        self.letters.append((subject, message, msg_id))


class DownDriver(FakeDriver):
    def check(self, user_ids: list[str]) -> None:
        raise ConnectionRefusedError("PostgreSQL is down")


async def test_one_bad_row_is_dead_lettered_and_the_rest_of_its_batch_is_written():
    engine, publisher = FakeEngine(), LetterPublisher()
    engine.driver = PickyDriver()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=1000)  # type: ignore[arg-type]
    good = [decision() for _ in range(200)]
    bad = Decision(decision_id=new_decision_id(), endpoint="e", arm_id="a", params={}, probability=1.0, user_id="x\x00")
    for d in [*good[:100], bad, *good[100:]]:
        log.record(d)
    assert await log.flush() == 201
    assert engine.driver.inserted == [d.decision_id for d in good]  # every good row, in order
    assert engine.driver.statements < 30  # found by bisecting, not one statement per row
    assert bad.decision_id not in publisher.messages and log.pending == 0
    [(subject, letter, msg_id)] = publisher.letters
    assert subject == "t.deadletter.optimizer-decision-log"
    assert bad.decision_id in letter.reason and "0x00" in letter.reason
    assert msg_id == f"optimizer-decision-log:{bad.decision_id}"
    # The next flush is an ordinary one statement again.
    log.record(decision())
    before = engine.driver.statements
    await log.flush()
    assert engine.driver.statements == before + 1


async def test_past_its_high_water_mark_the_log_refuses_and_keeps_nothing_more():
    engine, publisher = FakeEngine(), FakePublisher()
    engine.driver = DownDriver()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=10, max_pending=25)  # type: ignore[arg-type]
    for _ in range(25):
        log.record(decision())
    with pytest.raises(ResourceExhausted) as refused:
        log.record(decision())
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "decision log is full" in str(refused.value)
    # A failed flush moves the buffer to "unsent": that still counts, so there is no new room.
    with pytest.raises(ConnectionRefusedError):
        await log.flush()
    assert log.pending == 25
    started = time.monotonic()
    with pytest.raises(ResourceExhausted):
        await asyncio.to_thread(log.record, decision())  # from a worker thread: a bounded wait
    assert 0.9 <= time.monotonic() - started < 3.0  # room_wait_s, 1 s by default
    # The flusher has seen its flush fail (an outage): refused at once from now on, no wait.
    task = asyncio.create_task(log.run())
    try:
        assert await wait_for(lambda: log._failing)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(ResourceExhausted):
                await asyncio.to_thread(log.record, decision())
            assert time.monotonic() - started < 0.5
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert log.pending == 25
    # PostgreSQL is back: everything kept is written, and there is room again.
    engine.driver = FakeDriver()
    assert await log.flush() == 25
    log.record(decision())
    assert log.pending == 1


async def test_a_batch_is_recorded_whole_or_not_at_all():
    """SelectBatch's decisions: a batch that does not fit under the bound is refused without
    leaving part of it in the log (a decision logged that its caller never received)."""
    engine, publisher = FakeEngine(), FakePublisher()
    engine.driver = DownDriver()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=10, max_pending=25)  # type: ignore[arg-type]
    log.record_many([decision() for _ in range(20)])
    with pytest.raises(ResourceExhausted) as refused:
        log.record_many([decision() for _ in range(6)])  # 26 > 25: none of the six
    assert "6 more do not fit" in str(refused.value)
    assert log.pending == 20
    log.record_many([decision() for _ in range(5)])  # exactly up to the bound
    assert log.pending == 25
    with pytest.raises(ResourceExhausted):
        log.record(decision())
    engine.driver = FakeDriver()
    assert await log.flush() == 25


async def test_a_decision_too_large_for_the_bus_is_dead_lettered_and_the_others_published():
    engine, publisher = FakeEngine(), LetterPublisher()
    log = DecisionLog(engine, publisher, Catalogue("t"))  # type: ignore[arg-type]
    good = [decision() for _ in range(5)]
    huge = Decision(
        decision_id=new_decision_id(), endpoint="e", arm_id="a", params={}, probability=1.0, context={"x": "y" * 2**20}
    )
    for d in [*good[:2], huge, *good[2:]]:
        log.record(d)
    assert await log.flush() == 6
    published = set(publisher.messages)
    assert len(published) >= 2 and not any(huge.decision_id in m for m in published)
    [(_, letter, _)] = publisher.letters
    assert huge.decision_id in letter.reason and "more than the bus takes" in letter.reason
    assert letter.payload == b""  # too large to carry; the reason names the decision


class FlakyPublisher(FakePublisher):
    """Fails its first publish_many, as NATS does when it is away."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def publish_many(self, items: list) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("nats: timeout")
        await super().publish_many(items)


async def test_a_batch_retried_after_its_rows_committed_is_written_once_with_the_same_messages():
    """The rows of a batch whose publish failed are in already: its retry goes straight to the
    INSERT that skips them (not the first try's, which would fail on a duplicate key), and its
    messages keep their dedup ids."""
    engine, publisher = FakeEngine(), FlakyPublisher()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=10)  # type: ignore[arg-type]
    made = [decision() for _ in range(25)]
    log.record_many(made)
    with pytest.raises(TimeoutError):
        await log.flush()
    assert engine.driver.inserted == [d.decision_id for d in made] and log.pending == 25
    log.record(extra := decision())
    assert await log.flush() == 26
    assert engine.driver.inserted == [d.decision_id for d in [*made, extra]]
    assert engine.driver.statements == 3 and engine.driver.retries == 1  # first try, its retry, the new one
    assert len(publisher.messages) == len(set(publisher.messages)) == 4  # 3 of the retried batch, 1 new


async def test_a_worker_waits_for_the_flush_that_makes_room_and_its_batch_goes_in_whole():
    """At the bound a SelectBatch from a worker thread waits (up to room_wait_s) for a flush
    to make room instead of being refused; the event loop's own calls never wait (the flush
    needs the loop)."""
    engine, publisher = FakeEngine(), FakePublisher()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=10, max_pending=25, room_wait_s=5.0)  # type: ignore[arg-type]
    log.record_many([decision() for _ in range(20)])
    with pytest.raises(ResourceExhausted):
        log.record_many([decision() for _ in range(6)])  # on the loop's thread: refused at once
    late = [decision() for _ in range(6)]
    worker = asyncio.create_task(asyncio.to_thread(log.record_many, late))
    await asyncio.sleep(0.1)
    assert not worker.done() and log.pending == 20  # waiting, nothing of it in yet
    assert await log.flush() == 20
    await asyncio.wait_for(worker, 2.0)
    assert log.pending == 6
    assert await log.flush() == 6
    assert engine.driver.inserted[-6:] == [d.decision_id for d in late]
    with pytest.raises(ResourceExhausted):  # more than the bound can ever hold: no wait
        await asyncio.wait_for(asyncio.to_thread(log.record_many, [decision() for _ in range(26)]), 1.0)


async def test_a_caller_near_its_deadline_waits_no_longer_than_its_time_left():
    engine, publisher = FakeEngine(), FakePublisher()
    log = DecisionLog(engine, publisher, Catalogue("t"), max_batch=10, max_pending=5, room_wait_s=5.0)  # type: ignore[arg-type]
    log.record_many([decision() for _ in range(5)])
    started = time.monotonic()
    with pytest.raises(ResourceExhausted):
        await asyncio.to_thread(log.record_many, [decision()], wait_s=0.1)
    assert 0.09 <= time.monotonic() - started < 1.0 and log.pending == 5


# FeedbackHandler writes this replica's buffered decisions before applying feedback for them, so
# such a batch is applied in one transaction, not applied, flushed and applied again. The apply is
# a fake that knows only what the fake driver wrote (the real path: test_feedback_no_bounce.py).


@contextlib.asynccontextmanager
async def no_session():
    yield None


@pytest.fixture
def applies(monkeypatch: pytest.MonkeyPatch):
    """The fake apply: every call's decision ids; an id the driver has not written is NotLoggedYet."""
    calls: list[list[str]] = []

    def install(engine: FakeEngine) -> list[list[str]]:
        async def apply(session, *, items, window, folds):
            calls.append([it.decision_id for it in items])
            return [
                FeedbackOutcome(True, "e", "a", 1.0)
                if it.decision_id in engine.driver.inserted
                else NotLoggedYet(f"decision {it.decision_id!r} is not logged yet")
                for it in items
            ]

        monkeypatch.setattr(handlers.service, "apply_feedback_batch", apply)
        return calls

    return install


def item(decision_id: str) -> FeedbackItem:
    return FeedbackItem(event_id=f"ev-{decision_id}", decision_id=decision_id, reward=1.0, signals={})


async def test_feedback_for_a_buffered_decision_is_applied_once_after_a_flush(applies) -> None:
    engine = FakeEngine()
    log = DecisionLog(engine, FakePublisher(), Catalogue("t"), flush_interval_s=5.0)  # type: ignore[arg-type]
    calls = applies(engine)
    handler = handlers.FeedbackHandler(no_session, timedelta(days=1), log)  # type: ignore[arg-type]
    written, buffered = decision(), decision()
    log.record(written)
    await log.flush()
    log.record(buffered)
    assert log.holds_any({buffered.decision_id}) and not log.holds_any({written.decision_id, "other"})

    outcomes = await handler._apply([item(written.decision_id), item(buffered.decision_id)])

    assert all(type(o) is FeedbackOutcome for o in outcomes)
    assert calls == [[written.decision_id, buffered.decision_id]]  # one apply, after the flush
    assert buffered.decision_id in engine.driver.inserted and not log.holds_any({buffered.decision_id})


async def test_without_a_buffered_decision_nothing_is_flushed_first(applies) -> None:
    engine = FakeEngine()
    log = DecisionLog(engine, FakePublisher(), Catalogue("t"), flush_interval_s=5.0)  # type: ignore[arg-type]
    calls = applies(engine)
    handler = handlers.FeedbackHandler(no_session, timedelta(days=1), log)  # type: ignore[arg-type]
    other = decision()
    log.record(other)  # another endpoint's decision, in the buffer: not this batch's business

    outcomes = await handler._apply([item("unknown-decision")])

    # Not this replica's: applied, found missing, flushed (it may have been made meanwhile), tried again.
    assert isinstance(outcomes[0], NotLoggedYet)
    assert calls == [["unknown-decision"], ["unknown-decision"]]
    assert engine.driver.inserted == [other.decision_id]  # the fallback's flush
