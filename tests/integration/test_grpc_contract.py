"""The optimizer's gRPC contract: bad requests get INVALID_ARGUMENT / NOT_FOUND with a
message a person can act on; the bearer token is enforced except for health checks;
reflection lists the services."""

from __future__ import annotations

import math

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

from .helpers import three_arm_endpoint

pytestmark = pytest.mark.integration

INVALID, NOT_FOUND, EXISTS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
)


async def expect(call, code: grpc.StatusCode, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert words in info.value.details()


# Both gRPC servers the optimizer can run (FLYWHEEL_OPTIMIZER_GRPC_SERVER): the same contract.
SERVERS = pytest.mark.parametrize("server", ["aio", "sync"])


@SERVERS
async def test_bad_requests_get_clear_errors(launch, server):
    optimizer = launch("optimizer", env={"FLYWHEEL_OPTIMIZER_GRPC_SERVER": server})
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        sel = sel_grpc.SelectionServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("bot"))
        decision = await sel.Select(sel_pb.SelectRequest(endpoint="bot"))

        await expect(sel.Select(sel_pb.SelectRequest(endpoint="")), INVALID, "endpoint name is empty")
        await expect(sel.Select(sel_pb.SelectRequest(endpoint="nope")), NOT_FOUND, "'nope' does not exist")
        await expect(sel.SelectBatch(sel_pb.SelectBatchRequest()), INVALID, "at least one request")
        await expect(admin.CreateEndpoint(three_arm_endpoint("bot")), EXISTS, "already exists")
        await expect(admin.CreateEndpoint(three_arm_endpoint("has.dot")), INVALID, "[A-Za-z0-9_-]")
        await expect(
            admin.CreateEndpoint(admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name="empty"))),
            INVALID,
            "at least one arm",
        )
        await expect(
            admin.AddArm(admin_pb.AddArmRequest(endpoint="bot", arm=ep_pb.Arm(arm_id="small"))),
            EXISTS,
            "already exists",
        )
        await expect(
            admin.RetireArm(admin_pb.RetireArmRequest(endpoint="bot", arm_id="ghost")),
            NOT_FOUND,
            "'ghost' does not exist",
        )
        await expect(
            sel.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=math.nan, feedback_id="f1")),
            INVALID,
            "finite",
        )
        await expect(
            sel.Update(sel_pb.UpdateRequest(decision_id="ghost", reward=1.0, feedback_id="f2")), NOT_FOUND, "unknown"
        )
        await expect(
            sel.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, feedback_id="f3")), INVALID, "no reward"
        )

        # Update is idempotent on feedback_id.
        first = await sel.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=0.25, feedback_id="ok"))
        again = await sel.Update(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=0.25, feedback_id="ok"))
        assert (first.applied, again.applied) == (True, False)
        assert (again.stats.pulls, again.stats.alpha, again.stats.beta) == (1, 1.25, 1.75)

        # Retiring every arm but one works; the last one cannot go.
        await admin.RetireArm(admin_pb.RetireArmRequest(endpoint="bot", arm_id="small"))
        await admin.RetireArm(admin_pb.RetireArmRequest(endpoint="bot", arm_id="large"))
        await expect(
            admin.RetireArm(admin_pb.RetireArmRequest(endpoint="bot", arm_id="creative")),
            INVALID,
            "last active arm",
        )
        for _ in range(5):
            assert (await sel.Select(sel_pb.SelectRequest(endpoint="bot"))).arm_id == "creative"


@SERVERS
async def test_bearer_token_is_required_except_for_health(launch, server):
    optimizer = launch(
        "optimizer", env={"FLYWHEEL_OPTIMIZER_AUTH_TOKEN": "s3cret-token", "FLYWHEEL_OPTIMIZER_GRPC_SERVER": server}
    )
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await expect(
            admin.ListEndpoints(admin_pb.ListEndpointsRequest()), grpc.StatusCode.UNAUTHENTICATED, "bearer token"
        )
        await expect(
            admin.ListEndpoints(admin_pb.ListEndpointsRequest(), metadata=(("authorization", "Bearer no"),)),
            grpc.StatusCode.UNAUTHENTICATED,
            "bearer token",
        )
        await expect(  # the hot path too (on the sync server, a different wrapper)
            sel_grpc.SelectionServiceStub(channel).Select(sel_pb.SelectRequest(endpoint="bot")),
            grpc.StatusCode.UNAUTHENTICATED,
            "bearer token",
        )
        listed = await admin.ListEndpoints(
            admin_pb.ListEndpointsRequest(), metadata=(("authorization", "Bearer s3cret-token"),)
        )
        assert list(listed.endpoints) == []
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert "s3cret-token" not in optimizer.log_file.read_text()


@SERVERS
async def test_reflection_lists_the_services(launch, server):
    optimizer = launch("optimizer", env={"FLYWHEEL_OPTIMIZER_GRPC_SERVER": server})
    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = set()
        async for resp in responses:
            names |= {s.name for s in resp.list_services_response.service}
    assert {
        "flywheel.api.optimizer.v1.SelectionService",
        "flywheel.api.optimizer.v1.EndpointAdminService",
        "grpc.health.v1.Health",
    } <= names
