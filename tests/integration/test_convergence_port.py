"""The Convergence's runtime API on a real optimizer (issue 14): integer params come back as
integers, ``per_user=True`` learns a posterior per user, a retried ``runtime_update``
counts once, and errors come back in The Convergence's shapes (``success: False`` for an
unknown decision, a fallback arm when the optimizer cannot be reached).

The optimizer fixtures are those of ``test_sdk_cli`` (one optimizer for this module).
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import grpc
import pytest

from flywheel.sdk import FlywheelClient, SyncFlywheelClient
from flywheel.sdk import convergence as conv

from .test_sdk_cli import admin, module_env, optimizer, pulls  # noqa: F401 - fixtures for this module

pytestmark = pytest.mark.integration

PARAMS = {"model": "m-x", "max_tokens": 256, "temperature": 0.7, "n": 1, "extra": {"top_k": 40, "stop": [3, "end"]}}


@pytest.fixture
async def runtime(optimizer, monkeypatch):  # noqa: F811 - the imported fixture
    """The module's runtime pointed at this optimizer, closed afterwards."""
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", optimizer.address)
    for var in ("FLYWHEEL_NATS_URL", "FLYWHEEL_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    conv._runtime.overrides.clear()
    await conv.close_runtime()
    yield
    conv._runtime.overrides.clear()
    await conv.close_runtime()


async def test_integer_params_round_trip(runtime, optimizer):  # noqa: F811
    config = {"default_arms": [{"arm_id": "x", "params": PARAMS}]}
    await conv.configure_runtime("port-ints", config=config)
    selection = await conv.runtime_select("port-ints", user_id="u-1")
    assert selection.params == PARAMS
    assert type(selection.params["max_tokens"]) is int and type(selection.params["n"]) is int
    assert type(selection.params["temperature"]) is float
    assert type(selection.params["extra"]["top_k"]) is int and type(selection.params["extra"]["stop"][0]) is int

    # The same rule in both clients; int_params=False keeps protobuf's doubles.
    with SyncFlywheelClient(target=optimizer.address) as fw:
        assert type(fw.select("port-ints").params["max_tokens"]) is int
    async with FlywheelClient(target=optimizer.address, int_params=False) as fw:
        raw = (await fw.select("port-ints")).params
    assert type(raw["max_tokens"]) is float and raw["max_tokens"] == 256.0


async def test_per_user_posteriors_follow_each_users_preference(runtime, admin):  # noqa: F811
    config = [{"model": "x"}, {"model": "y"}]  # arms arm-0 (x) and arm-1 (y)
    await conv.configure_runtime("port-per-user", config=config, per_user=True)
    ep = await asyncio.to_thread(admin.get, "port-per-user")
    assert ep.policy.segment_key == "user_id"
    liked = {"alice": "arm-0", "bob": "arm-1"}  # opposite preferences

    for _ in range(40):
        for user, arm in liked.items():
            s = await conv.runtime_select("port-per-user", user_id=user)
            result = await conv.runtime_update(
                "port-per-user", user_id=user, decision_id=s.decision_id, reward=1.0 if s.arm_id == arm else 0.0
            )
            assert result["success"] and result["applied"]

    served = {user: Counter() for user in liked}
    for _ in range(40):
        for user in liked:
            served[user][(await conv.runtime_select("port-per-user", user_id=user)).arm_id] += 1
    assert served["alice"]["arm-0"] >= 32, served  # each user mostly gets the arm they liked
    assert served["bob"]["arm-1"] >= 32, served

    # A live endpoint keeps its policy: asking for per-user learning of a shared one is an error.
    await conv.configure_runtime("port-shared", config=config)
    with pytest.raises(ValueError, match="not per user"):
        await conv.configure_runtime("port-shared", config=config, per_user=True)


async def test_a_retried_update_counts_once(runtime, admin):  # noqa: F811
    await conv.configure_runtime("port-retry", config=[{"model": "x"}])
    s = await conv.runtime_select("port-retry", user_id="u-1")
    first = await conv.runtime_update("port-retry", user_id="u-1", decision_id=s.decision_id, reward=1.0)
    again = await conv.runtime_update("port-retry", user_id="u-1", decision_id=s.decision_id, reward=1.0)
    assert first["success"] and first["applied"] and first["stats"]["pulls"] == 1
    assert again["success"] and not again["applied"] and again["stats"]["pulls"] == 1
    assert await pulls(admin, "port-retry") == {"arm-0": 1}
    assert again["stats"]["mean"] == first["stats"]["mean"]

    # Several outcomes of one decision: one idempotency key each, each counted once.
    for key in ("click", "purchase", "purchase"):
        await conv.runtime_update("port-retry", decision_id=s.decision_id, reward=1.0, idempotency_key=key)
    assert await pulls(admin, "port-retry") == {"arm-0": 3}


async def test_errors_in_the_convergences_shapes(runtime):
    config = [{"model": "x", "max_tokens": 64}, {"model": "y"}]
    await conv.configure_runtime("port-errors", config=config)
    result = await conv.runtime_update("port-errors", decision_id="no-such-decision", reward=0.5, grading_score=0.2)
    assert result["success"] is False and result["code"] == "NOT_FOUND"
    assert "no-such-decision" in result["error"]
    assert result["reward"] == 0.5 and result["grading_score"] == 0.2

    # An endpoint the optimizer does not have: The Convergence's fallback, nothing logged.
    fallback = await conv.runtime_select("port-never-configured", user_id="u-1")
    assert fallback.decision_id is None and fallback.arm_id == "default" and fallback.params == {}
    assert fallback.metadata["fallback"] is True and "NOT_FOUND" in fallback.metadata["error"]
    refused = await conv.runtime_update("port-never-configured", decision_id=fallback.decision_id, reward=1.0)
    assert refused["success"] is False and "fallback" in refused["error"]
    with pytest.raises(grpc.RpcError) as raised:
        await conv.runtime_select("port-never-configured", fallback=False)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND

    # An app that starts while the optimizer is down: configure_runtime raises, and selects
    # serve the config's first arm (ints intact) until the optimizer is back.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: connection refused
        with pytest.raises(grpc.RpcError):
            await conv.configure_runtime("port-errors", config=config, target=dead)
        down = await conv.runtime_select("port-errors", user_id="u-1")
    assert down.decision_id is None and down.arm_id == "arm-0"
    assert down.params == {"model": "x", "max_tokens": 64} and type(down.params["max_tokens"]) is int
    assert "UNAVAILABLE" in down.metadata["error"]
