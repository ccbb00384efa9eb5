"""EventConsumer's Deferred outcome: a message whose handler will know its outcome shortly is
left unsettled while the fetch loop goes on, and settled (ack, nak or dead letter, by the usual
rules) when its future resolves; past the bound on deferred groups it is a plain Retry; stop()
waits for deferred messages, then gives up on them (JetStream redelivers what was never settled).
The real NATS path, two optimizer replicas, is tests/integration/test_feedback_two_replicas.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.consumer import Deferred, EventConsumer, Reject, Retry
from flywheel.core.bus.publisher import Publisher


class FakeMsg:
    def __init__(self, seq: int) -> None:
        self.subject = "t.product.feedback.bot"
        self.headers: dict[str, str] = {}
        self.data = FeedbackEvent(meta=EventMeta(event_id=f"e{seq}"), decision_id="d").SerializeToString()
        self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_delivered=1)
        self.settled: str | None = None
        self.delay: float | None = None

    async def ack(self) -> None:
        self.settled = "ack"

    async def nak(self, delay: float | None = None) -> None:
        self.settled, self.delay = "nak", delay


class FakeSub:
    """Hands out the given batches one per fetch, then times out like an idle stream."""

    def __init__(self, *batches: list[FakeMsg]) -> None:
        self.batches = list(batches)
        self.fetched = 0

    async def fetch(self, batch: int, timeout: float) -> list[FakeMsg]:  # noqa: ASYNC109 - nats-py's signature
        if not self.batches:
            await asyncio.sleep(0.01)
            raise TimeoutError
        self.fetched += 1
        return self.batches.pop(0)

    async def unsubscribe(self) -> None:
        pass


class Letters(Publisher):
    def __init__(self) -> None:
        self.sent: list = []

    async def publish(self, subject, message, *, msg_id=None, as_json=False):  # type: ignore[override]
        self.sent.append(message)


def consumer(handler, max_deferred: int = 64) -> tuple[EventConsumer, Letters]:
    c = EventConsumer(
        js=None,  # type: ignore[arg-type]
        catalogue=Catalogue("t"),
        spec=Catalogue("t").consumer("optimizer-feedback"),
        message_type=FeedbackEvent,
        batch_handler=handler,
        max_deferred=max_deferred,
    )
    letters = Letters()
    c._publisher = letters
    return c, letters


async def until(predicate, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_deferred_message_is_settled_later_and_does_not_block_the_next_fetch():
    loop = asyncio.get_running_loop()
    later: dict[str, asyncio.Future] = {}

    async def handler(items):
        out = []
        for event, _ in items:
            if event.meta.event_id in ("e0", "e1"):  # the first batch: outcome known later
                later[event.meta.event_id] = loop.create_future()
                out.append(Deferred(later[event.meta.event_id], "not written yet"))
            else:
                out.append(None)
        return out

    first, second = [FakeMsg(0), FakeMsg(1)], [FakeMsg(2), FakeMsg(3)]
    sub = FakeSub(first, second)
    c, letters = consumer(handler)
    run = asyncio.create_task(c._run(sub))  # type: ignore[arg-type]
    # The second batch is fetched and acked while the first one's outcomes are still open.
    await until(lambda: all(m.settled == "ack" for m in second))
    assert sub.fetched == 2
    assert [m.settled for m in first] == [None, None]
    assert c.deferred_groups == 1
    later["e0"].set_result(None)
    later["e1"].set_result(Reject("decision unknown"))
    await until(lambda: all(m.settled for m in first))
    assert [m.settled for m in first] == ["ack", "ack"]  # e1 acked after its dead letter
    assert [letter.reason for letter in letters.sent] == ["decision unknown"]
    await until(lambda: c.deferred_groups == 0)
    await c.stop(timeout_s=1.0)
    await run


async def test_a_deferred_retry_is_nakked_with_its_delay_and_a_failure_with_backoff():
    loop = asyncio.get_running_loop()
    futures = [loop.create_future(), loop.create_future()]

    async def handler(items):
        return [Deferred(f, "later") for f in futures]

    c, _ = consumer(handler)
    msgs = [FakeMsg(0), FakeMsg(1)]
    await c._process(msgs)  # type: ignore[arg-type]
    assert [m.settled for m in msgs] == [None, None]
    futures[0].set_result(Retry("still not written", delay_s=0.05))
    futures[1].set_exception(ConnectionRefusedError("PostgreSQL is down"))
    await until(lambda: all(m.settled for m in msgs))
    assert [(m.settled, m.delay) for m in msgs] == [("nak", 0.05), ("nak", 0.4)]


async def test_past_the_bound_a_deferral_is_a_retry_at_once():
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future] = []

    async def handler(items):
        futures.append(loop.create_future())
        return [Deferred(futures[-1], "later", delay_s=0.07) for _ in items]

    c, _ = consumer(handler, max_deferred=1)
    held, over = [FakeMsg(0)], [FakeMsg(1)]
    await c._process(held)  # type: ignore[arg-type]
    await c._process(over)  # type: ignore[arg-type]
    assert held[0].settled is None and (over[0].settled, over[0].delay) == ("nak", 0.07)
    for f in futures:
        f.set_result(None)
    await until(lambda: held[0].settled == "ack")


async def test_stop_waits_for_deferred_messages_then_leaves_the_rest_to_redelivery():
    loop = asyncio.get_running_loop()
    soon, never = loop.create_future(), loop.create_future()

    async def handler(items):
        return [Deferred(soon if e.meta.event_id == "e0" else never, "later") for e, _ in items]

    c, _ = consumer(handler)
    msgs = [FakeMsg(0)], [FakeMsg(1)]
    await c._process(msgs[0])  # type: ignore[arg-type]
    await c._process(msgs[1])  # type: ignore[arg-type]
    loop.call_later(0.05, soon.set_result, None)
    started = loop.time()
    await c.stop(timeout_s=0.3)
    assert 0.25 < loop.time() - started < 1.0
    assert msgs[0][0].settled == "ack"  # resolved within the timeout: settled
    assert msgs[1][0].settled is None  # never resolved: unsettled, JetStream redelivers it
    assert c.deferred_groups == 0


def test_the_reply_subject_is_read_as_nats_py_reads_it():
    from nats.aio.msg import Msg

    from flywheel.core.bus.consumer import _facts

    for reply in (
        "$JS.ACK.ns-product.optimizer-feedback.3.1207.1190.1764021234567890123.42",  # v1
        "$JS.ACK._.acchash.ns-product.optimizer-feedback.3.1207.1190.1764021234567890123.42.rnd",  # v2
    ):
        msg = Msg(_client=None, subject="s", reply=reply)  # type: ignore[arg-type]
        meta = msg.metadata
        sequence, delivered, stored, pending = _facts(msg)
        assert (sequence, delivered, pending) == (meta.sequence.stream, meta.num_delivered, meta.num_pending)
        assert stored == pytest.approx(meta.timestamp.timestamp(), abs=1e-6)
