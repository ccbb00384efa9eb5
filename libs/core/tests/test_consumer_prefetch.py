"""EventConsumer's prefetch: while a batch is handled the consumer fetches on, holding at most
``batch_size`` messages; what it holds is handled next as one batch, in the order fetched, and
stop() handles what is in hand before it returns. Without prefetch it fetches only between
batches, unless the batch's last message says more wait behind it (a backlog): then the next
fetch runs while the batch is handled. With ``max_batches`` > 1 a batch starts while earlier
ones are still in flight. The real NATS path is the optimizer's feedback consumer
(tests/integration)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.consumer import EventConsumer


class FakeMsg:
    def __init__(self, seq: int) -> None:
        self.subject = "p.product.feedback.bot"
        self.headers: dict[str, str] = {}
        self.data = FeedbackEvent(meta=EventMeta(event_id=f"e{seq}"), decision_id="d").SerializeToString()
        # num_pending: what waits in the stream behind this message when it is fetched (JetStream's).
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_delivered=1, num_pending=0)
        self.acked = False

    async def ack(self) -> None:
        self.acked = True


class Stream:
    """A stream the test appends to; fetch returns up to ``batch`` waiting messages, or waits for
    the first one and times out like an idle JetStream pull."""

    def __init__(self) -> None:
        self.waiting: list[FakeMsg] = []
        self.arrived = asyncio.Event()
        self.asked: list[int] = []

    def append(self, *seqs: int) -> list[FakeMsg]:
        msgs = [FakeMsg(s) for s in seqs]
        self.waiting += msgs
        self.arrived.set()
        return msgs

    async def fetch(self, batch: int, timeout: float) -> list[FakeMsg]:  # noqa: ASYNC109 - nats-py's signature
        self.asked.append(batch)
        if not self.waiting:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except TimeoutError:
                raise TimeoutError from None
        out, self.waiting = self.waiting[:batch], self.waiting[batch:]
        for i, msg in enumerate(out):
            msg.metadata.num_pending = len(out) - 1 - i + len(self.waiting)
        return out

    async def unsubscribe(self) -> None:
        pass


class Gate:
    """A batch handler that records each batch's event ids and waits for the test's release."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()

    async def __call__(self, items):
        self.batches.append([e.meta.event_id for e, _ in items])
        await self.release.wait()
        return [None] * len(items)


def consumer(handler, *, prefetch: bool, batch_size: int = 4) -> EventConsumer:
    return EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=Catalogue("p"),
        spec=Catalogue("p").consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=handler,
        batch_size=batch_size,
        fetch_timeout_s=0.05,
        prefetch=prefetch,
    )


async def until(predicate, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_what_arrives_while_a_batch_is_handled_is_fetched_and_handled_next_as_one_batch():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=True)
    run = asyncio.create_task(c._run(stream))  # type: ignore[arg-type]
    first = stream.append(0)
    await until(lambda: len(gate.batches) == 1)
    # The handler holds batch [e0]; e1..e5 arrive meanwhile and are fetched, up to batch_size (4).
    later = stream.append(1, 2) + stream.append(3, 4, 5)
    await until(lambda: c._held == 4)
    await asyncio.sleep(0.05)
    assert c._held == 4
    assert len(stream.waiting) == 1  # e5 stays in the stream: the bound on what is held
    assert not any(m.acked for m in later)
    gate.release.set()
    await until(lambda: all(m.acked for m in first + later))
    assert gate.batches == [["e0"], ["e1", "e2", "e3", "e4"], ["e5"]]
    assert max(stream.asked) <= 4 and min(stream.asked) >= 1  # never asks for more than there is room
    await c.stop(timeout_s=1.0)
    await run


async def test_without_prefetch_nothing_is_fetched_while_a_batch_is_handled():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=False)
    run = asyncio.create_task(c._run(stream))  # type: ignore[arg-type]
    stream.append(0)
    await until(lambda: len(gate.batches) == 1)
    asked = len(stream.asked)
    stream.append(1, 2)
    await asyncio.sleep(0.1)
    assert len(stream.asked) == asked and len(stream.waiting) == 2
    gate.release.set()
    await until(lambda: gate.batches == [["e0"], ["e1", "e2"]])
    await c.stop(timeout_s=1.0)
    await run


async def test_without_prefetch_a_backlog_is_fetched_ahead_while_a_batch_is_handled():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=False, batch_size=2)
    c._task = asyncio.create_task(c._run(stream))  # type: ignore[arg-type]
    msgs = stream.append(0, 1, 2, 3, 4)
    await until(lambda: len(gate.batches) == 1)
    # [e0, e1] is held by the handler; e1 said 3 more wait, so [e2, e3] is fetched meanwhile.
    await until(lambda: len(stream.waiting) == 1)
    await asyncio.sleep(0.05)
    assert stream.asked == [2, 2] and len(stream.waiting) == 1  # one batch ahead, not more
    assert not any(m.acked for m in msgs)
    gate.release.set()
    await until(lambda: all(m.acked for m in msgs))
    assert gate.batches == [["e0", "e1"], ["e2", "e3"], ["e4"]]
    await c.stop(timeout_s=1.0)


async def test_stop_handles_the_batch_fetched_ahead_too():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=False, batch_size=2)
    c._task = asyncio.create_task(c._run(stream))  # type: ignore[arg-type]
    msgs = stream.append(0, 1, 2, 3)
    await until(lambda: len(gate.batches) == 1 and not stream.waiting)  # [e2, e3] fetched ahead
    stopping = asyncio.create_task(c.stop(timeout_s=2.0))
    await asyncio.sleep(0.05)
    assert not stopping.done()
    gate.release.set()
    await stopping
    assert c._task.done()
    assert gate.batches == [["e0", "e1"], ["e2", "e3"]]
    assert all(m.acked for m in msgs)


async def test_stop_handles_what_is_in_hand_before_it_returns():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=True)
    c._task = asyncio.create_task(c._run(stream))  # type: ignore[arg-type]
    first = stream.append(0)
    await until(lambda: len(gate.batches) == 1)
    held = stream.append(1, 2)
    await until(lambda: c._held == 2)
    stopping = asyncio.create_task(c.stop(timeout_s=2.0))
    await asyncio.sleep(0.1)
    assert not stopping.done()  # the batch in hand is still being handled
    gate.release.set()
    await stopping
    assert all(m.acked for m in first + held)
    assert gate.batches == [["e0"], ["e1", "e2"]]
    assert c._task.done()


async def test_max_batches_handles_a_second_batch_while_the_first_is_in_flight():
    stream, gate = Stream(), Gate()
    c = consumer(gate, prefetch=False, batch_size=4)
    two = EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=Catalogue("p2"),
        spec=Catalogue("p2").consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=gate,
        batch_size=4,
        fetch_timeout_s=0.05,
        max_batches=2,
    )
    assert not c._prefetch and two._prefetch  # more than one batch at once implies the prefetch
    run = asyncio.create_task(two._run(stream))  # type: ignore[arg-type]
    msgs = stream.append(0)
    await until(lambda: len(gate.batches) == 1)
    msgs += stream.append(1, 2)
    await until(lambda: len(gate.batches) == 2)  # started while [e0] is still held by the gate
    assert gate.batches == [["e0"], ["e1", "e2"]]
    msgs += stream.append(3)
    await until(lambda: two._held == 1)
    await asyncio.sleep(0.05)
    assert len(gate.batches) == 2  # both slots busy: e3 waits in hand
    gate.release.set()
    await until(lambda: all(m.acked for m in msgs))
    assert gate.batches[2] == ["e3"]
    await two.stop(timeout_s=1.0)
    await run
    with pytest.raises(ValueError, match="max_batches"):
        EventConsumer(
            js=None,  # type: ignore[arg-type]
            catalogue=Catalogue("p3"),
            spec=Catalogue("p3").consumer("optimizer-feedback"),
            message_type=FeedbackEvent,
            batch_handler=gate,
            max_batches=0,
        )
