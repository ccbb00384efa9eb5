"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TypeVar

from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb

T = TypeVar("T")


def three_arm_endpoint(name: str) -> admin_pb.CreateEndpointRequest:
    arms = []
    for arm_id, model, temperature in (
        ("small", "gpt-4o-mini", 0.2),
        ("large", "gpt-4o", 0.2),
        ("creative", "gpt-4o", 0.9),
    ):
        params = Struct()
        params.update({"model": model, "temperature": temperature})
        arms.append(ep_pb.Arm(arm_id=arm_id, params=params))
    return admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name=name, arms=arms))


def sdk_nats(env: dict[str, str], namespace: str | None = None) -> dict[str, str]:
    """The SDK's NATS keyword arguments for a product whose settings are ``env``."""
    return {
        "nats_url": env["FLYWHEEL_NATS_URL"],
        "nats_user": env["FLYWHEEL_NATS_USER"],
        "nats_password": env["FLYWHEEL_NATS_PASSWORD"],
        "namespace": namespace if namespace is not None else env["FLYWHEEL_NATS_NAMESPACE"],
    }


async def eventually(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, timeout_s: float = 10.0, interval_s: float = 0.1
) -> T:
    """Poll ``probe`` until ``check`` accepts its value; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    value = await probe()
    while not check(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last value: {value!r}")
        await asyncio.sleep(interval_s)
        value = await probe()
    return value


async def collect(js, subject: str, stream: str, message_type, count: int, timeout_s: float = 60.0) -> list:
    """Read messages from a stream until ``count`` arrived (then a short grace for extras)."""
    sub = await js.pull_subscribe(subject, stream=stream)
    got: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                batch = await sub.fetch(100, timeout=1.0 if len(got) < count else 0.5)
            except Exception:
                if len(got) >= count:
                    break
                continue
            for msg in batch:
                got.append(message_type.FromString(msg.data))
                await msg.ack()
        return got
    finally:
        await sub.unsubscribe()


def metrics(port: int) -> str:
    """A service's Prometheus exposition text."""
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` with exactly ``labels`` (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
