"""A service's ack-wait setting on a real NATS server: ``with_ack_wait`` overrides the catalogue's,
``ensure_consumer`` puts the new value on a durable consumer that already exists with another,
and ``ensure_topology`` (which every service runs at start) does not put the catalogue's back on
an interest consumer its owner declared: an unacked message then comes back after the short wait."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from flywheel.api.subjects import Catalogue
from flywheel.core.bus.connection import ensure_consumer, ensure_topology, with_ack_wait

pytestmark = pytest.mark.integration
DURABLE = "trace-store-traces"  # the consumer of an interest stream: ensure_topology declares it too


def test_with_ack_wait_replaces_only_the_ack_wait():
    spec = Catalogue("t").consumer(DURABLE)
    assert with_ack_wait(spec, None) is spec
    short = with_ack_wait(spec, 1.5)
    assert short.ack_wait == timedelta(seconds=1.5)
    for kept in ("durable", "stream", "filter_subject", "description", "max_deliver", "max_ack_pending"):
        assert getattr(short, kept) == getattr(spec, kept), kept
    with pytest.raises(ValueError, match="ack wait"):
        with_ack_wait(spec, 0)


async def _ack_wait_s(js, spec) -> float:
    return (await js.consumer_info(spec.stream, spec.durable)).config.ack_wait


async def test_an_existing_consumer_gets_the_new_ack_wait_and_topology_keeps_it(nats_client, isolation):
    js = nats_client.jetstream()
    catalogue = Catalogue(isolation["namespace"])
    spec = catalogue.consumer(DURABLE)
    await ensure_topology(js, catalogue)  # what any service does at start: declared with 30 s
    assert await _ack_wait_s(js, spec) == pytest.approx(30.0)

    short = with_ack_wait(spec, 1.0)
    await ensure_consumer(js, short)  # the owner starts with its setting
    assert await _ack_wait_s(js, spec) == pytest.approx(1.0)
    await ensure_topology(js, catalogue)  # another service starts later: the owner's value stays
    assert await _ack_wait_s(js, spec) == pytest.approx(1.0)
    await ensure_consumer(js, spec)  # the owner started again without the setting: back to 30 s
    assert await _ack_wait_s(js, spec) == pytest.approx(30.0)
    await ensure_consumer(js, short)
    assert await _ack_wait_s(js, spec) == pytest.approx(1.0)

    # What that means on the wire: a message fetched and never acked is delivered again ~1 s later.
    await js.publish(catalogue.traces("helper"), b"x", headers={"Nats-Msg-Id": uuid.uuid4().hex})
    sub = await js.pull_subscribe_bind(spec.durable, spec.stream)
    try:
        (first,) = await sub.fetch(1, timeout=5)
        taken = time.monotonic()
        assert first.metadata.num_delivered == 1
        again = None
        while again is None and time.monotonic() - taken < 20:
            try:
                (again,) = await sub.fetch(1, timeout=1)
            except NatsTimeoutError:
                continue
        waited = time.monotonic() - taken
        assert again is not None, "not redelivered within 20 s"
        assert again.metadata.num_delivered == 2 and again.metadata.sequence.stream == first.metadata.sequence.stream
        assert 0.8 <= waited < 10, waited  # the 1 s ack wait, not the catalogue's 30 s
        await again.ack()
    finally:
        await sub.unsubscribe()


async def test_the_charts_setup_job_leaves_an_owners_settings_alone(nats_client, isolation, stack_env, monkeypatch):
    """``python -m flywheel.core.bus declare`` runs before every upgrade; it creates what is
    missing but must not put the catalogue's 30 s back on a consumer whose owner set 1 s."""
    from flywheel.core.bus.__main__ import declare
    from flywheel.core.settings import NatsSettings

    js = nats_client.jetstream()
    catalogue = Catalogue(isolation["namespace"])
    await ensure_topology(js, catalogue)
    owned = with_ack_wait(catalogue.consumer("optimizer-feedback"), 1.0)
    await ensure_consumer(js, owned)
    for key, value in stack_env.items():  # the admin's settings, as the job gets them
        monkeypatch.setenv(key, value)
    await declare(NatsSettings())
    assert await _ack_wait_s(js, owned) == pytest.approx(1.0)
    for spec in catalogue.consumers.values():  # and every other consumer now exists
        assert (await js.consumer_info(spec.stream, spec.durable)).config.durable_name == spec.durable
