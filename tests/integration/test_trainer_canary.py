"""Into production on real servers: a registered version is enrolled as a canary arm of an
optimizer endpoint (its adapter, trained by the trainer's library and put on S3, loaded by the
real model server at run time), products get it from Select and call it through LiteLLM, and
the registry follows the bandit: a better canary is promoted by the optimizer and becomes the
active version (the previous one retires), a worse one is retired and rolled back (the active
version stays, the adapter is unloaded), and an active version whose arm is retired is rolled
back to the one before. Every change is a PolicyChangedEvent. Enrolments the rules or the
servers refuse name the problem (an adapter the model server cannot find fails the version)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import litellm
import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1.events_pb2 import PolicyChangedEvent
from flywheel.core import db
from flywheel.core.bus.connection import ensure_topology
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import FailedPrecondition, NotFound
from flywheel.core.settings import DatabaseSettings
from flywheel.core.validation import Invalid
from flywheel.sdk import FlywheelClient
from flywheel.stack.testing import migrate_in_process as migrate
from flywheel.trainer.registry import service
from flywheel.trainer.registry.canary import Canaries, Links
from flywheel.trainer.registry.events import PolicyEvents
from flywheel.trainer.registry.models import PolicyRow
from flywheel.trainer.registry.rules import Status

from .helpers import collect, eventually
from .lora_session import LoraSession, lora_session
from .runtime_lora import RuntimeLoraServer, upload_folder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ENDPOINT = "support"
ENDPOINT_B = "support-b"  # the second test's: the tests share the module's optimizer
_migrated: set[str] = set()


@pytest.fixture(scope="module")
def shared(servers, session_stack, tmp_path_factory: pytest.TempPathFactory) -> LoraSession:
    """The session's runtime-LoRA model server (shared with test_modelserver_lora.py)."""
    return lora_session(session_stack, servers, tmp_path_factory)


@pytest.fixture(scope="module")
def adapter_uri(shared: LoraSession, servers) -> tuple[str, str]:
    """(bucket, s3:// prefix) of an adapter trained on the tiny base, as a job leaves it."""
    return shared.bucket, upload_folder(servers.env(), shared.bucket, "policies/canary/adapter", shared.adapter)


@pytest.fixture(scope="module")
def model_server(shared: LoraSession) -> RuntimeLoraServer:
    return shared.server


@dataclass
class Registry:
    sessions: async_sessionmaker[AsyncSession]
    events: PolicyEvents

    async def register(self, name: str, uri: str = "") -> PolicyRow:
        async with self.sessions() as session:
            outcome = await service.register(
                session,
                registration=service.Registration(name=name, kind=jobs.TRAINING_KIND_SFT, checkpoint_uri=uri),
                actor="test",
                reason="trained",
            )
        await self.events.publish(outcome.history)
        return next(iter(outcome.policies.values()))

    async def promote(self, policy_id: str) -> None:
        async with self.sessions() as session:
            outcome = await service.promote(session, policy_id=policy_id, actor="test", reason="first version")
        await self.events.publish(outcome.history)

    async def get(self, policy_id: str) -> PolicyRow:
        async with self.sessions() as session:
            return await service.get_policy(session, policy_id=policy_id)


@pytest.fixture(scope="module")
def optimizer(launch_module):
    """The module's optimizer (one process for both tests, each with its own endpoint)."""
    return launch_module("optimizer", env={"FLYWHEEL_OPTIMIZER_LIFECYCLE_INTERVAL_S": "0.3"})


@pytest.fixture
async def registry(launch_module, nats_client, monkeypatch) -> AsyncIterator[Registry]:
    """The trainer's registry tables in the module's schema, used in process (the tests use
    policy names of their own)."""
    launch = launch_module
    env = launch.servers.service_env("trainer", **launch.isolation)
    if env["FLYWHEEL_DB_SCHEMA"] not in _migrated:
        migrate("trainer", env)
        _migrated.add(env["FLYWHEEL_DB_SCHEMA"])
    monkeypatch.setenv("FLYWHEEL_DB_URL", env["FLYWHEEL_DB_URL"])
    monkeypatch.setenv("FLYWHEEL_DB_SCHEMA", env["FLYWHEEL_DB_SCHEMA"])
    engine = db.create_engine(DatabaseSettings())  # type: ignore[call-arg]
    js = nats_client.jetstream()
    catalogue = Catalogue(launch.isolation["namespace"])
    await ensure_topology(js, catalogue)
    yield Registry(db.session_factory(engine), PolicyEvents(db.session_factory(engine), Publisher(js), catalogue))
    await engine.dispose()


def endpoint_request(model_server: RuntimeLoraServer, endpoint: str = ENDPOINT) -> admin_pb.CreateEndpointRequest:
    params = Struct()
    params.update({"model": "openai/tiny-random", "api_base": model_server.url, "temperature": 0})
    policy = ep_pb.PolicySpec(
        kind=ep_pb.POLICY_KIND_THOMPSON_BETA,
        canary=ep_pb.CanaryRule(min_pulls=5, promote_probability=0.9, retire_probability=0.1),
    )
    arm = ep_pb.Arm(arm_id="base", params=params, status=ep_pb.ARM_STATUS_ACTIVE)
    return admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name=endpoint, arms=[arm], policy=policy))


async def drive(
    fw: FlywheelClient,
    admin,
    arm_id: str,
    *,
    canary_reward: float,
    until: int,
    tries: int = 300,
    endpoint: str = ENDPOINT,
) -> None:
    """Select and reward (the canary ``canary_reward``, the base arm the opposite) until the
    optimizer gives the canary arm the status ``until``."""
    for i in range(tries):
        decision = await fw.select(endpoint, user_id=f"u{i}")
        await fw.update(decision, reward=canary_reward if decision.arm_id == arm_id else 1 - canary_reward)
        if i % 5 == 4:
            found = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=endpoint))
            if next(a for a in found.endpoint.arms if a.arm_id == arm_id).status == until:
                return
    raise AssertionError(f"arm {arm_id} did not reach {ep_pb.ArmStatus.Name(until)} in {tries} decisions")


async def arm(admin, arm_id: str, endpoint: str = ENDPOINT) -> ep_pb.Arm:
    found = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=endpoint))
    return next(a for a in found.endpoint.arms if a.arm_id == arm_id)


def served(model_server: RuntimeLoraServer) -> list[str]:
    got = httpx.get(f"{model_server.url}/models", headers={"Authorization": f"Bearer {model_server.api_key}"})
    return [m["id"] for m in got.json()["data"]]


def links(optimizer, model_server: RuntimeLoraServer) -> Links:
    return Links(
        optimizer_address=optimizer.address, modelserver_url=model_server.url, modelserver_api_key=model_server.api_key
    )


async def test_a_better_canary_is_promoted_and_the_registry_follows(
    launch_module, optimizer, registry, model_server, adapter_uri, nats_client
):
    name = "support-a"
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(endpoint_request(model_server))
        v1 = await registry.register(name, "s3://elsewhere/v1")
        await registry.promote(v1.policy_id)
        v2 = await registry.register(name, adapter_uri[1])

        canaries = Canaries(registry.sessions, registry.events, links(optimizer, model_server))
        arm_id = await canaries.enrol(policy_id=v2.policy_id, endpoint=ENDPOINT, traffic_cap=0.5, actor="job-1")
        assert arm_id == "support-a-v2"
        assert await canaries.enrol(policy_id=v2.policy_id, endpoint=ENDPOINT, traffic_cap=0.5, actor="job-1") == arm_id
        canary = await arm(admin, arm_id)
        assert (canary.status, canary.traffic_cap) == (ep_pb.ARM_STATUS_CANARY, 0.5)
        assert json_format.MessageToDict(canary.params) == {
            "model": "openai/support-a-v2",  # the incumbent's provider prefix kept
            "api_base": model_server.url,
            "temperature": 0,
            "policy_id": v2.policy_id,
        }
        row = await registry.get(v2.policy_id)
        assert (row.status, row.endpoint, row.arm_id, row.served_model) == (
            Status.CANARY,
            ENDPOINT,
            arm_id,
            "support-a-v2",
        )
        assert "support-a-v2" in served(model_server)
        assert await canaries.follow_once() == []  # nothing decided yet

        async with FlywheelClient(target=optimizer.address) as fw:
            # A product calls what Select hands it: the canary's model on the model server.
            for i in range(50):
                decision = await fw.select(ENDPOINT, user_id=f"p{i}")
                if decision.arm_id == arm_id:
                    break
            assert decision.arm_id == arm_id
            reply = await litellm.acompletion(
                model=decision.params["model"],
                api_base=decision.params["api_base"],
                api_key=model_server.api_key,
                messages=[{"role": "user", "content": "Capital of Peru?"}],
                max_tokens=4,
            )
            assert reply.model.endswith("support-a-v2")

            await drive(fw, admin, arm_id, canary_reward=1.0, until=ep_pb.ARM_STATUS_ACTIVE)

        followed = await canaries.follow_once()
        assert [(f.policy_id, f.status) for f in followed] == [(v2.policy_id, Status.ACTIVE)]
        assert "the bandit promoted arm support-a-v2" in followed[0].reason
        assert (await registry.get(v2.policy_id)).status == Status.ACTIVE
        assert (await registry.get(v1.policy_id)).status == Status.RETIRED
        assert await canaries.follow_once() == []  # followed once, not again

        # The active version's arm retired (by an operator here): Rollback, v1 returns.
        await admin.RetireArm(admin_pb.RetireArmRequest(endpoint=ENDPOINT, arm_id=arm_id))
        followed = await canaries.follow_once()
        assert [(f.policy_id, f.status) for f in followed] == [(v2.policy_id, Status.ROLLED_BACK)]
        assert (await registry.get(v1.policy_id)).status == Status.ACTIVE
        assert "support-a-v2" not in served(model_server)  # its adapter unloaded
        await canaries.close()

    ns = launch_module.isolation["namespace"]
    events = await collect(
        nats_client.jetstream(),
        Catalogue(ns).policy_changed(name),
        f"{ns.upper()}_TRAINER_EVENTS",
        PolicyChangedEvent,
        8,
    )
    seen = [(e.policy.version, e.policy.status) for e in events]
    assert seen == [
        (1, jobs.POLICY_STATUS_REGISTERED),
        (1, jobs.POLICY_STATUS_ACTIVE),
        (2, jobs.POLICY_STATUS_REGISTERED),
        (2, jobs.POLICY_STATUS_CANARY),
        (1, jobs.POLICY_STATUS_RETIRED),
        (2, jobs.POLICY_STATUS_ACTIVE),
        (2, jobs.POLICY_STATUS_ROLLED_BACK),
        (1, jobs.POLICY_STATUS_ACTIVE),
    ]
    assert events[3].policy.arm_id == arm_id and events[3].policy.served_model == "support-a-v2"


async def test_a_worse_canary_is_retired_and_rolled_back(optimizer, registry, model_server, adapter_uri):
    name = "support-b"
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(endpoint_request(model_server, ENDPOINT_B))
        v1 = await registry.register(name, "s3://elsewhere/v1")
        await registry.promote(v1.policy_id)
        v2 = await registry.register(name, adapter_uri[1])
        canaries = Canaries(registry.sessions, registry.events, links(optimizer, model_server))
        arm_id = await canaries.enrol(policy_id=v2.policy_id, endpoint=ENDPOINT_B, traffic_cap=0, actor="job-2")
        assert (await arm(admin, arm_id, ENDPOINT_B)).traffic_cap == pytest.approx(0.1)  # 0: the default cap
        assert "support-b-v2" in served(model_server)

        async with FlywheelClient(target=optimizer.address) as fw:
            await drive(fw, admin, arm_id, canary_reward=0.0, until=ep_pb.ARM_STATUS_RETIRED, endpoint=ENDPOINT_B)

        followed = await eventually(canaries.follow_once, lambda f: bool(f), timeout_s=5)
        assert [(f.policy_id, f.status) for f in followed] == [(v2.policy_id, Status.ROLLED_BACK)]
        assert "the bandit retired arm support-b-v2" in followed[0].reason
        assert (await registry.get(v2.policy_id)).status == Status.ROLLED_BACK
        assert (await registry.get(v1.policy_id)).status == Status.ACTIVE  # the active version stays
        assert "support-b-v2" not in served(model_server)

        # Refusals, each naming the problem.
        v3 = await registry.register(name, adapter_uri[1])
        with pytest.raises(NotFound, match="endpoint: no optimizer endpoint 'nowhere'"):
            await canaries.enrol(policy_id=v3.policy_id, endpoint="nowhere", traffic_cap=0.1, actor="t")
        with pytest.raises(Invalid, match="traffic_cap"):
            await canaries.enrol(policy_id=v3.policy_id, endpoint=ENDPOINT_B, traffic_cap=1.5, actor="t")
        with pytest.raises(FailedPrecondition, match="rule: transition"):  # rolled back is final
            await canaries.enrol(policy_id=v2.policy_id, endpoint=ENDPOINT_B, traffic_cap=0.1, actor="t")
        # An adapter the model server cannot find: the version is marked FAILED, saying why.
        missing = await registry.register(name, f"s3://{adapter_uri[0]}/no/such/adapter")
        with pytest.raises(FailedPrecondition, match=r"no adapter_config\.json"):
            await canaries.enrol(policy_id=missing.policy_id, endpoint=ENDPOINT_B, traffic_cap=0.1, actor="t")
        assert (await registry.get(missing.policy_id)).status == Status.FAILED
        await canaries.close()
