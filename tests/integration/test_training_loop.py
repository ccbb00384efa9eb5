"""The learning half of the loop, end to end on real servers and real processes (optimizer,
trace store, trainer; NATS, PostgreSQL, S3): a product's decisions, traces and feedback →
the trace store's preference export → a DPO job (tiny model, LoRA) → policy v1 in the
registry, enrolled as a canary arm of the endpoint → promoted by the bandit when feedback
favours it, and the registry follows (v1 active). Then a second run whose feedback disfavours
v2: the bandit retires its arm, the registry rolls v2 back and v1 stays the active version.
The optimizer and trainer are the session's (``warm_trainer``: torch imported once for every
job test); the endpoint, agent and policy name are this test's alone."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.common.v1.common_pb2 import PageRequest
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.sdk import FlywheelClient
from flywheel.sdk.tracing import Tracer, prompt, trace

from .helpers import eventually, sdk_nats
from .trainer_jobs import CITIES, COUNTRIES, s3, session_optimizer, wait_job, warm_trainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ENDPOINT = "support"
AGENT = "support-bot"


def create_endpoint() -> admin_pb.CreateEndpointRequest:
    params = Struct()
    params.update({"model": "openai/smollm2", "temperature": 0})
    policy = ep_pb.PolicySpec(
        kind=ep_pb.POLICY_KIND_THOMPSON_BETA,
        canary=ep_pb.CanaryRule(min_pulls=5, promote_probability=0.9, retire_probability=0.1),
    )
    arm = ep_pb.Arm(arm_id="base", params=params, status=ep_pb.ARM_STATUS_ACTIVE)
    return admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name=ENDPOINT, arms=[arm], policy=policy))


async def product_traffic(fw: FlywheelClient, tracer: Tracer) -> list[str]:
    """What a product does: Select, answer (traced, with the decision id), publish feedback.
    Two answers per question: the city alone earns 0.9, a hedge 0.1."""
    trace_ids = []
    for i, (country, city) in enumerate(zip(COUNTRIES * 2, CITIES * 2, strict=True)):
        question = f"What is the capital of {country}? (ticket {i})"
        for answer, reward in ((city, 0.9), (f"Maybe {CITIES[(i + 3) % 10]}? I am not sure.", 0.1)):
            decision = await fw.select(ENDPOINT, user_id=f"user-{i}")
            with trace("answer a ticket", input=question, decision_id=decision.decision_id, tracer=tracer) as run:
                with prompt("answer", input=question, model=decision.params["model"], tracer=tracer) as p:
                    p.output = answer
                trace_ids.append(run.trace_id)
            await fw.feedback(decision, reward=reward)
    tracer.flush()
    return trace_ids


async def drive(fw: FlywheelClient, admin, arm_id: str, *, canary_reward: float, until: int) -> int:
    """Select and reward the canary ``canary_reward`` (the base arm the opposite) until the
    optimizer gives the canary arm the status ``until``; returns the decisions it took."""
    for i in range(400):
        decision = await fw.select(ENDPOINT, user_id=f"traffic-{i}")
        await fw.update(decision, reward=canary_reward if decision.arm_id == arm_id else 1 - canary_reward)
        if i % 5 == 4:
            found = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=ENDPOINT))
            if next(a for a in found.endpoint.arms if a.arm_id == arm_id).status == until:
                return i + 1
    raise AssertionError(f"arm {arm_id} did not reach {ep_pb.ArmStatus.Name(until)} in 400 decisions")


async def train_canary(trainer_stub, store_stub, name: str) -> jobs.Policy:
    """Export the preference pairs the traces hold, train DPO on them, return the version."""
    export = await store_stub.ExportDataset(
        ts_pb.ExportDatasetRequest(
            kind=ts_pb.DATASET_KIND_PREFERENCE,
            filter=ts_pb.QueryTracesRequest(agent=AGENT),
            validation_fraction=0.2,
            min_margin=0.5,
        )
    )
    spec = jobs.TrainingJobSpec(
        kind=jobs.TRAINING_KIND_DPO,
        base_model="tiny",
        dataset_uri=export.manifest_uri,
        lora=jobs.LoraSpec(r=4, alpha=8),
        endpoint=ENDPOINT,
        policy_name=name,
        canary_traffic_cap=0.5,
    )
    spec.hyperparameters.update({"max_steps": 2, "batch_size": 4, "max_length": 64})
    job = (await trainer_stub.SubmitJob(pb.SubmitJobRequest(spec=spec))).job
    done = await wait_job(trainer_stub, job.job_id, timeout_s=400)
    assert done.state == jobs.JOB_STATE_SUCCEEDED and not done.error, done
    policy = (await trainer_stub.GetPolicy(pb.GetPolicyRequest(policy_id=done.policy_id))).policy
    assert (policy.job_id, policy.dataset_uri) == (done.job_id, export.manifest_uri)
    return policy


async def test_feedback_to_trained_canary_promoted_then_a_worse_one_rolled_back(launch_session):
    launch = launch_session
    trainer = warm_trainer(launch)  # follows canaries on the session's optimizer
    optimizer = session_optimizer(launch)
    store = launch("trace_store")
    try:
        await feedback_to_canaries(launch, optimizer, store, trainer)
    finally:
        store.stop()


async def feedback_to_canaries(launch, optimizer, store, trainer) -> None:
    product_env = launch.servers.env(**launch.isolation, nats_role="product")
    ns = launch.isolation["namespace"]
    tracer = Tracer(
        nats_url=product_env["FLYWHEEL_NATS_URL"],
        nats_user=product_env["FLYWHEEL_NATS_USER"],
        nats_password=product_env["FLYWHEEL_NATS_PASSWORD"],
        namespace=ns,
        agent=AGENT,
    )
    async with (
        grpc.aio.insecure_channel(optimizer.address) as opt_channel,
        grpc.aio.insecure_channel(store.address) as store_channel,
        grpc.aio.insecure_channel(trainer.address) as trainer_channel,
        FlywheelClient(
            target=optimizer.address,
            **sdk_nats(product_env, ns),
        ) as fw,
    ):
        admin = admin_grpc.EndpointAdminServiceStub(opt_channel)
        store_stub = ts_grpc.TraceStoreServiceStub(store_channel)
        trainer_stub = pb_grpc.TrainerServiceStub(trainer_channel)
        await admin.CreateEndpoint(create_endpoint())

        # 1. Decisions, traces and feedback from the product, joined by the trace store.
        trace_ids = await product_traffic(fw, tracer)

        async def rewarded() -> int:
            found = await store_stub.QueryTraces(ts_pb.QueryTracesRequest(agent=AGENT, page=PageRequest(page_size=100)))
            return sum(1 for t in found.traces if t.HasField("reward"))

        await eventually(rewarded, lambda n: n == len(trace_ids), timeout_s=60)

        # 2. Export -> DPO job -> v1, enrolled as a canary arm of the endpoint.
        v1 = await train_canary(trainer_stub, store_stub, "support-dpo")
        assert (v1.version, v1.status, v1.endpoint) == (1, jobs.POLICY_STATUS_CANARY, ENDPOINT)
        bucket, key = v1.dataset_uri.removeprefix("s3://").split("/", 1)
        manifest = json.loads(s3(launch.env).get_object(bucket, key).read())
        assert set(manifest["source_traces"]) <= set(trace_ids) and len(manifest["source_traces"]) >= 20
        endpoint = (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=ENDPOINT))).endpoint
        canary = next(a for a in endpoint.arms if a.arm_id == v1.arm_id)
        assert canary.status == ep_pb.ARM_STATUS_CANARY and canary.traffic_cap == pytest.approx(0.5)
        # The incumbent's params, its model swapped for the version's name (provider prefix kept).
        assert canary.params["policy_id"] == v1.policy_id and canary.params["model"] == "openai/support-dpo-v1"

        # 3. Feedback favours v1: the bandit promotes its arm, the registry follows.
        await drive(fw, admin, v1.arm_id, canary_reward=1.0, until=ep_pb.ARM_STATUS_ACTIVE)

        async def status(policy_id: str) -> int:
            return (await trainer_stub.GetPolicy(pb.GetPolicyRequest(policy_id=policy_id))).policy.status

        await eventually(lambda: status(v1.policy_id), lambda s: s == jobs.POLICY_STATUS_ACTIVE, timeout_s=30)

        # 4. A second run whose feedback disfavours the new version: retired, rolled back.
        v2 = await train_canary(trainer_stub, store_stub, "support-dpo")
        assert (v2.version, v2.status) == (2, jobs.POLICY_STATUS_CANARY)
        await drive(fw, admin, v2.arm_id, canary_reward=0.0, until=ep_pb.ARM_STATUS_RETIRED)
        await eventually(lambda: status(v2.policy_id), lambda s: s == jobs.POLICY_STATUS_ROLLED_BACK, timeout_s=30)
        assert await status(v1.policy_id) == jobs.POLICY_STATUS_ACTIVE  # the previous version is active
        listed = (await trainer_stub.ListPolicies(pb.ListPoliciesRequest(name="support-dpo"))).policies
        assert sorted((p.version, p.status) for p in listed) == [
            (1, jobs.POLICY_STATUS_ACTIVE),
            (2, jobs.POLICY_STATUS_ROLLED_BACK),
        ]
    await asyncio.sleep(0)
