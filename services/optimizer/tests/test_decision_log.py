"""DecisionLog's flusher: it sleeps while there is nothing to write, and a decision recorded from
a worker thread of the sync gRPC server wakes it (no lost wake-up). The real PostgreSQL and
JetStream path is covered by tests/integration/test_decision_batches.py; here both are fakes
that record what they were given."""

from __future__ import annotations

import asyncio
import threading
import time

from flywheel.api.subjects import Catalogue
from flywheel.optimizer.decisions import Decision, DecisionLog, new_decision_id


class FakeDriver:
    def __init__(self) -> None:
        self.inserted: list[str] = []

    async def execute(self, _sql: str, *columns: object) -> None:
        self.inserted.extend(columns[0])  # type: ignore[arg-type]


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
