"""The SDK and the ``flywheel`` CLI against a real optimizer: async and sync clients,
``decide()``, The Convergence's runtime functions, ``flywheel endpoint apply|get|list``
and ``flywheel ope``.

One optimizer serves the whole module (starting one costs seconds), so each test works on
endpoints of its own names. It is started like the ``launch`` fixture does (migrate, start,
wait for SERVING), but with module scope, which ``launch`` does not offer.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.sdk import FlywheelClient, SyncFlywheelClient
from flywheel.sdk import convergence as conv
from flywheel.sdk.admin import AdminClient
from flywheel.sdk.cli import main as cli_main
from flywheel.sdk.endpoint_file import parse_endpoint
from flywheel.stack.services import ServiceProcess
from flywheel.stack.stack import Servers
from flywheel.stack.testing import migrate_in_process as migrate

from .helpers import eventually, sdk_nats

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def module_env(servers: Servers) -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return servers.env(namespace=f"t{tag}", schema=f"t_{tag}", bucket_prefix=f"t{tag}")


@pytest.fixture(scope="module")
def optimizer(module_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    migrate("optimizer", module_env)
    proc = ServiceProcess("optimizer", env=module_env, log_dir=tmp_path_factory.mktemp("sdk-services"))
    proc.start()
    try:
        proc.wait_serving()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def admin(optimizer: ServiceProcess) -> Iterator[AdminClient]:
    with AdminClient(target=optimizer.address) as client:
        yield client


def create(admin: AdminClient, name: str, **extra) -> pb.Endpoint:
    arms = [{"arm_id": "a", "params": {"model": "m-a"}}, {"arm_id": "b", "params": {"model": "m-b"}}]
    return admin.create(parse_endpoint({"name": name, "arms": arms, **extra}).to_proto())


async def pulls(admin: AdminClient, name: str) -> dict[str, int]:
    ep = await asyncio.to_thread(admin.get, name)
    return {s.arm_id: s.pulls for s in ep.stats}


async def test_async_and_sync_clients_select_and_report(optimizer, module_env, admin):
    create(admin, "clients")

    async with FlywheelClient(target=optimizer.address, **sdk_nats(module_env)) as fw:
        d = await fw.select("clients", user_id="u-1", context={"lang": "en"})
        assert d.arm_id in {"a", "b"} and d.params == {"model": f"m-{d.arm_id}"} and 0 < d.probability <= 1
        await fw.feedback(d, reward=1.0)  # NATS
        got = await eventually(lambda: pulls(admin, "clients"), lambda p: p[d.arm_id] == 1)
        assert sum(got.values()) == 1

    async with FlywheelClient(target=optimizer.address) as fw:  # no NATS: update over gRPC
        d = await fw.select("clients")
        resp = await fw.update(d, reward=0.0)
        assert resp.applied and resp.stats.arm_id == d.arm_id
        with pytest.raises(RuntimeError, match="no nats_url"):
            await fw.feedback(d, reward=1.0)

    # The sync client from several threads at once: selects over gRPC, feedback over NATS
    # through its one private event loop.
    def sync_work() -> None:
        with SyncFlywheelClient(target=optimizer.address, **sdk_nats(module_env)) as fw:

            def worker() -> None:
                for _ in range(5):
                    fw.feedback(fw.select("clients", user_id="u-2"), reward=1.0)

            threads = [threading.Thread(target=worker) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            loop_thread = fw._loop._thread
        assert not loop_thread.is_alive()  # close() stopped the private loop
        with SyncFlywheelClient(target=optimizer.address) as fw:
            d = fw.select("clients")
            assert fw.update(d, signals={"quality": 1.0}).applied

    await asyncio.to_thread(sync_work)
    await eventually(lambda: pulls(admin, "clients"), lambda p: sum(p.values()) == 1 + 1 + 30 + 1)


async def test_decide_reports_latency_cost_reward_and_errors(optimizer, module_env, admin, nats_client):
    create(admin, "decide")
    subject = Catalogue(module_env["FLYWHEEL_NATS_NAMESPACE"]).feedback("decide")
    sub = await nats_client.subscribe(subject)

    async def next_event() -> FeedbackEvent:
        return FeedbackEvent.FromString((await sub.next_msg(timeout=5)).data)

    async with FlywheelClient(target=optimizer.address, **sdk_nats(module_env)) as fw:
        async with fw.decide("decide", user_id="u-1") as dc:
            assert dc.params["model"].startswith("m-")
            await asyncio.sleep(0.05)
            dc.add_cost(0.001)
            dc.add_cost(0.002)
            dc.add_signal("quality", 0.8)
            dc.set_reward(0.9)
        event = await next_event()
        assert event.decision_id == dc.decision.decision_id and event.reward == pytest.approx(0.9)
        assert set(event.signals) == {"latency_ms", "cost_usd", "quality"}
        assert 49 <= event.signals["latency_ms"] < 5000
        assert event.signals["cost_usd"] == pytest.approx(0.003) and event.signals["quality"] == pytest.approx(0.8)

        seen = []

        async def failing() -> None:
            async with fw.decide("decide") as dc:
                seen.append(dc.decision_id)
                dc.set_reward(1.0)
                raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):
            await failing()
        event = await next_event()
        assert event.decision_id == seen[0]
        assert event.HasField("reward") and event.reward == 0.0
        assert event.signals["error"] == 1.0 and "latency_ms" in event.signals and "cost_usd" not in event.signals

    def sync_decide() -> str:
        with SyncFlywheelClient(target=optimizer.address, **sdk_nats(module_env)) as fw:
            with fw.decide("decide") as dc:
                time.sleep(0.02)
                dc.add_signal("quality", 1.0)
            return dc.decision_id

    decision_id = await asyncio.to_thread(sync_decide)
    event = await next_event()
    assert event.decision_id == decision_id and not event.HasField("reward")
    assert event.signals["latency_ms"] >= 20 and event.signals["quality"] == 1.0
    await eventually(lambda: pulls(admin, "decide"), lambda p: sum(p.values()) == 3)

    # Over gRPC (no NATS), on an endpoint whose reward is the latency signal: the posterior
    # moves by the measured milliseconds, so the signal reached the server and was weighed.
    create(admin, "decide-grpc", policy={"kind": "thompson_gaussian"}, reward={"signal_weights": {"latency_ms": 1}})
    async with FlywheelClient(target=optimizer.address) as fw:
        async with fw.decide("decide-grpc") as dc:
            await asyncio.sleep(0.03)
        with pytest.raises(KeyError):
            async with fw.decide("decide-grpc"):
                raise KeyError("boom")
    stats = {s.arm_id: s for s in (await asyncio.to_thread(admin.get, "decide-grpc")).stats}
    assert sum(s.pulls for s in stats.values()) == 2
    assert 29 <= sum(s.reward_sum for s in stats.values()) < 5000  # the failure added reward 0.0
    await sub.unsubscribe()


async def test_convergence_runtime_functions(optimizer, module_env, admin, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", optimizer.address)
    for key, value in module_env.items():
        if key.startswith("FLYWHEEL_NATS_"):
            monkeypatch.setenv(key, value)
    await conv.close_runtime()
    config = {
        "system": "conv",
        "default_arms": [
            {"arm_id": "fast", "name": "Fast", "params": {"model": "mini", "temperature": 0.2}},
            {"arm_id": "smart", "params": {"model": "big"}},
        ],
        "selection_strategy": {"stability_min_pulls": 20, "stability_improvement_threshold": 0.05},
        "reward_evaluator": {"metrics": {"rating": {"name": "rating", "weight": 1.0}}},
    }
    # Two processes configuring at once: one creates, the other reuses (ALREADY_EXISTS).
    await asyncio.gather(conv.configure_runtime("conv", config=config), conv.configure_runtime("conv", config))
    ep = await asyncio.to_thread(admin.get, "conv")
    assert [a.arm_id for a in ep.arms] == ["fast", "smart"]
    assert ep.policy.incumbent.min_pulls == 20 and ep.policy.incumbent.min_margin == pytest.approx(0.05)
    assert dict(ep.reward_spec.signal_weights) == {"rating": 1.0}

    # Configuring again adds what is missing and nothing else; a param list names arm-<i>.
    more = {**config, "default_arms": [*config["default_arms"], {"arm_id": "creative", "params": {"t": 0.9}}]}
    await conv.configure_runtime("conv", config=more)
    await conv.configure_runtime("conv", config=[{"model": "x"}])
    await conv.configure_runtime("conv")  # no config: the endpoint exists, nothing to do
    ep = await asyncio.to_thread(admin.get, "conv")
    assert [a.arm_id for a in ep.arms] == ["fast", "smart", "creative", "arm-0"]
    with pytest.raises(ValueError, match="does not exist"):
        await conv.configure_runtime("conv-missing")

    selection = await conv.runtime_select("conv", user_id="user_123", context={"lang": "en"})
    assert selection.arm_id in {"fast", "smart", "creative", "arm-0"}
    assert selection.decision_id and 0 < selection.probability <= 1
    assert selection.params == {a.arm_id: dict(a.params) for a in ep.arms}[selection.arm_id]
    result = await conv.runtime_update(
        "conv", user_id="user_123", decision_id=selection.decision_id, reward=0.8, grading_score=0.5
    )
    assert result["success"] and result["applied"] and result["arm_id"] == selection.arm_id
    assert result["stats"]["pulls"] == 1

    # Signals only: the endpoint's weights (from reward_evaluator) make the reward.
    second = await conv.runtime_select("conv", user_id="user_123", agent_type="support")
    result = await conv.runtime_update(
        "conv", user_id="user_123", decision_id=second.decision_id, signals={"rating": 1}
    )
    assert result["applied"]
    with pytest.raises(ValueError, match="needs a reward"):
        await conv.runtime_update("conv", decision_id=second.decision_id)
    counts = await pulls(admin, "conv")
    assert sum(counts.values()) == 2
    await conv.close_runtime()


def flywheel_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as users run it: a separate process configured by the environment."""
    return subprocess.run(
        [sys.executable, "-m", "flywheel.sdk.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def flywheel_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The same entry point in this process (no interpreter start-up: keeps the module fast)."""
    capsys.readouterr()
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def test_cli_apply_get_list_and_ope(optimizer, admin, tmp_path: Path, monkeypatch, capsys):
    env = {**os.environ, "FLYWHEEL_OPTIMIZER_ADDRESS": optimizer.address}
    env.pop("FLYWHEEL_AUTH_TOKEN", None)
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", optimizer.address)
    monkeypatch.delenv("FLYWHEEL_AUTH_TOKEN", raising=False)
    spec = {
        "name": "cli-bot",
        "description": "answers tickets",
        "arms": [
            {"arm_id": "small", "params": {"model": "gpt-4o-mini", "temperature": 0.2}},
            {"arm_id": "large", "params": {"model": "gpt-4o", "temperature": 0.2}},
            {"arm_id": "creative", "params": {"model": "gpt-4o", "temperature": 0.9}},
        ],
        "policy": {"kind": "thompson_beta", "exploration_floor": 0.05},
        "reward": {"signal_weights": {"quality": 1.0}},
    }
    path = tmp_path / "endpoint.yaml"
    path.write_text(yaml.safe_dump(spec))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return flywheel_cli(env, *args)

    first = await asyncio.to_thread(cli, "endpoint", "apply", str(path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "+ create endpoint 'cli-bot' (thompson_beta) with arms small, large, creative",
        "endpoint 'cli-bot': applied 1 change",
    ]
    again = await asyncio.to_thread(cli, "endpoint", "apply", str(path))
    assert again.returncode == 0 and again.stdout.strip() == "endpoint 'cli-bot': no changes"

    # Edit: add an arm, drop one, change the policy. The dry run changes nothing.
    spec["arms"] = [*spec["arms"][:2], {"arm_id": "tuned", "params": {"model": "ft:v2"}}]
    spec["policy"] = {"kind": "thompson_beta", "exploration_floor": 0.1, "half_life_s": 3600}
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = flywheel_in_process(capsys, "endpoint", "apply", str(path), "--dry-run")
    assert code == 0 and out.splitlines()[0] == "endpoint 'cli-bot': plan (dry run, nothing changed):"
    assert "  - retire arm 'creative'" in out.splitlines()
    assert [a.arm_id for a in admin.get("cli-bot").arms] == ["small", "large", "creative"]
    edited = await asyncio.to_thread(cli, "endpoint", "apply", str(path), "--target", optimizer.address)
    assert edited.returncode == 0, edited.stderr
    assert edited.stdout.splitlines() == [
        "~ policy.exploration_floor: 0.05 -> 0.1",
        "~ policy.half_life_s: 0.0 -> 3600.0",
        '+ added arm \'tuned\' params {"model": "ft:v2"}',
        "- retired arm 'creative'",
        "endpoint 'cli-bot': applied 3 changes",
    ]
    ep = admin.get("cli-bot")
    assert {a.arm_id: a.status for a in ep.arms} == {
        "small": pb.ARM_STATUS_ACTIVE,
        "large": pb.ARM_STATUS_ACTIVE,
        "creative": pb.ARM_STATUS_RETIRED,
        "tuned": pb.ARM_STATUS_ACTIVE,
    }
    assert ep.policy.exploration_floor == pytest.approx(0.1) and ep.policy.half_life_s == 3600
    code, out, _ = flywheel_in_process(capsys, "endpoint", "apply", str(path))
    assert (code, out.strip()) == (0, "endpoint 'cli-bot': no changes")

    # Log a few hundred decisions with feedback over gRPC Update, then evaluate offline.
    rng = random.Random(7)
    truth = {"small": 0.3, "large": 0.7, "tuned": 0.5}
    async with FlywheelClient(target=optimizer.address) as fw:

        async def one() -> None:
            d = await fw.select("cli-bot")
            await fw.update(d, reward=float(rng.random() < truth[d.arm_id]), timeout_s=10)

        for _ in range(6):
            await asyncio.gather(*(one() for _ in range(50)))

    ope, bad = await asyncio.gather(
        asyncio.to_thread(cli, "ope", "cli-bot", "--arm", "large", "--json"),
        asyncio.to_thread(cli, "ope", "cli-bot", "--arm", "nope"),
    )
    assert ope.returncode == 0, ope.stderr
    result = json.loads(ope.stdout)
    assert result["samples"] == 300 and result["candidate"] == {"arm_id": "large"}
    assert [e["estimator"] for e in result["estimates"]] == ["ips", "snips", "dr"]
    assert 0 <= result["logged_value"] <= 1 and 0 < result["effective_sample_size"] <= 300
    for e in result["estimates"]:
        assert e["ci_low"] <= e["value"] <= e["ci_high"]
    snips = result["estimates"][1]
    assert snips["ci_low"] - 0.15 < truth["large"] < snips["ci_high"] + 0.15
    assert bad.returncode == 1
    assert bad.stderr.strip() == "error: INVALID_ARGUMENT: arm 'nope' is not an arm of 'cli-bot'"
    assert "Traceback" not in bad.stderr

    code, out, _ = flywheel_in_process(
        capsys, "ope", "cli-bot", "--distribution", "small=0.5,large=0.5", "--confidence", "0.9"
    )
    assert code == 0 and "samples 300" in out and "90% INTERVAL" in out
    assert [line.split()[0] for line in out.splitlines()[3:]] == ["IPS", "SNIPS", "DR"]
    code, out, _ = flywheel_in_process(capsys, "ope", "cli-bot", "--current", "--since", "2000-01-01")
    assert code == 0 and "policy (Thompson sampling or IDS) on the current posteriors" in out

    code, out, _ = flywheel_in_process(capsys, "endpoint", "get", "cli-bot")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "endpoint     cli-bot - answers tickets"
    assert lines[1] == "policy       thompson_beta (exploration_floor 0.1, half_life_s 3600.0)"
    rows = {line.split()[0]: line.split() for line in lines[5:]}
    assert set(rows) == {"ARM", "small", "large", "creative", "tuned"}
    assert rows["creative"][1] == "retired" and int(rows["large"][2]) > 0
    assert sum(int(r[2]) for name, r in rows.items() if name != "ARM") == 300

    code, out, _ = flywheel_in_process(capsys, "endpoint", "list")
    assert code == 0 and any(line.startswith("cli-bot") and "(+1 retired)" in line for line in out.splitlines())
    code, _, err = flywheel_in_process(capsys, "endpoint", "get", "no-such-endpoint")
    assert (code, err.strip()) == (1, "error: NOT_FOUND: endpoint 'no-such-endpoint' does not exist")
