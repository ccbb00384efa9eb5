"""Least privilege on the bus: every role connects to NATS as its own user, allowed only the
subjects it produces and the durable consumers it reads (flywheel.api.subjects.ROLES).

A product's credentials publish feedback and spans and read nothing; only the optimizer's
publish evaluation requests; the services themselves run a whole loop without a single
permissions violation in the server's log."""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from pathlib import Path

import grpc
import nats
import pytest
from nats.aio.client import Client as Nats
from nats.errors import TimeoutError as NatsTimeoutError

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1.events_pb2 import DecisionBatch
from flywheel.api.subjects import ROLES, Catalogue, Permissions, role_permissions
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind
from flywheel.core.bus.connection import ensure_consumer, ensure_topology
from flywheel.sdk import FlywheelClient
from flywheel.stack.servers import NatsServer
from flywheel.stack.stack import Servers

from .helpers import eventually, sdk_nats, three_arm_endpoint

pytestmark = pytest.mark.integration


class Probe:
    """A NATS connection as one role's user, recording the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Nats

    @classmethod
    async def connect(cls, server: NatsServer, role: str) -> Probe:
        probe = cls()

        async def on_error(exc: Exception) -> None:
            probe.errors.append(str(exc))

        user, password = server.credentials(role)
        probe.nc = await nats.connect(
            server.url,
            user=user,
            password=password,
            name=f"probe-{role}",
            error_cb=on_error,
            allow_reconnect=False,
            inbox_prefix=ROLES[role].inbox,  # as the service connects (flywheel.core.bus.connection)
        )
        return probe

    def violations(self, kind: str) -> list[str]:
        """Subjects the server refused, lower-cased as nats-py reports them."""
        found = [re.search(rf'permissions violation for {kind} to "(.*)"', e) for e in self.errors]
        return [m.group(1) for m in found if m]

    async def refused_publish(self, subject: str, payload: bytes) -> bool:
        """True when JetStream never acknowledged the publish and the server said why."""
        try:
            await self.nc.jetstream().publish(subject, payload, timeout=0.5)
        except NatsTimeoutError:
            await asyncio.sleep(0.1)  # the -ERR may trail the timeout
            return subject.lower() in self.violations("publish")
        return False

    async def close(self) -> None:
        await self.nc.close()


async def stream_count(nats_client: Nats, stream: str) -> int:
    return (await nats_client.jetstream().stream_info(stream)).state.messages


def evaluation_request(run_id: str) -> EvaluationRequest:
    return EvaluationRequest(
        meta=EventMeta(event_id=uuid.uuid4().hex, source="test"), request_id=uuid.uuid4().hex, run_id=run_id
    )


def span_batch(agent: str) -> SpanBatch:
    span = Span(
        trace_id=secrets.token_hex(16),
        span_id=secrets.token_hex(8),
        kind=SpanKind.SPAN_KIND_PROMPT,
        agent=agent,
        input="how do I brew tea?",
        output="with hot water",
    )
    span.start_time.GetCurrentTime()
    span.end_time.GetCurrentTime()
    return SpanBatch(meta=EventMeta(event_id=uuid.uuid4().hex, source="test"), spans=[span])


def service_violations(log_file: Path, services: tuple[str, ...]) -> list[str]:
    """Violations the server logged for connections of the named services (services connect
    with their name as the NATS client name)."""
    names = "|".join(services)
    pattern = re.compile(rf'"v[^"]*:({names})" - .*Violation')  # the client name, not the user name
    return [line for line in log_file.read_text(errors="replace").splitlines() if pattern.search(line)]


async def test_product_feedback_and_spans_flow_and_the_services_need_nothing_more(
    launch, servers: Servers, product_env, isolation
):
    optimizer = launch("optimizer")
    trace_store = launch("trace_store")
    ns = isolation["namespace"]
    assert optimizer.env["FLYWHEEL_NATS_USER"] == "optimizer"
    assert trace_store.env["FLYWHEEL_NATS_USER"] == "trace_store"

    async with grpc.aio.insecure_channel(optimizer.address) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        await admin.CreateEndpoint(three_arm_endpoint("support-bot"))
        # The SDK as a product runs it: feedback over NATS with the product's user.
        async with FlywheelClient(
            target=optimizer.address,
            **sdk_nats(product_env, ns),
        ) as fw:
            decision = await fw.select("support-bot", user_id="u-1")
            await fw.feedback(decision, reward=1.0)

        async def chosen_arm():
            got = await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))
            return {s.arm_id: s for s in got.endpoint.stats}[decision.arm_id]

        applied = await eventually(chosen_arm, lambda s: s.pulls == 1)
        assert (applied.alpha, applied.beta) == (2.0, 1.0)

    product = await Probe.connect(servers.nats, "product")
    try:
        spans = span_batch("helper")
        ack = await product.nc.jetstream().publish(Catalogue(ns).traces("helper"), spans.SerializeToString())
        assert ack.stream.endswith("_TRACES")
        assert product.errors == []
    finally:
        await product.close()

    async with grpc.aio.insecure_channel(trace_store.address) as channel:
        stub = ts_grpc.TraceStoreServiceStub(channel)

        async def stored():
            try:
                return await stub.GetTrace(ts_pb.GetTraceRequest(trace_id=spans.spans[0].trace_id))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return None

        got = await eventually(stored, lambda r: r is not None)
        assert got.spans[0].input == "how do I brew tea?"

        async def decision_with_feedback():
            try:
                return (await stub.GetDecision(ts_pb.GetDecisionRequest(decision_id=decision.decision_id))).decision
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return None

        # Decisions (published by the optimizer's user) and feedback reach the trace store's user.
        await eventually(decision_with_feedback, lambda r: r is not None and len(r.feedback) == 1)

    # Declaring streams, pulling, acking, publishing decisions: all within the services' allow-lists.
    assert service_violations(servers.nats.log_file, ("optimizer", "trace_store")) == []


async def test_product_may_not_publish_what_services_produce(servers: Servers, nats_client, isolation):
    catalogue = Catalogue(isolation["namespace"])
    await ensure_topology(nats_client.jetstream(), catalogue)
    request = evaluation_request("run-1").SerializeToString()
    forged = {
        catalogue.evaluation_request("run-1"): request,
        catalogue.decision("support-bot"): DecisionBatch().SerializeToString(),
        catalogue.evaluation_result("run-1"): b"{}",
        catalogue.run_progress("run-1"): b"{}",
        catalogue.society_proposal("run-1"): b"{}",
        catalogue.training_job("sft"): b"{}",
        catalogue.dead_letter("optimizer-feedback"): b"{}",
    }
    product = await Probe.connect(servers.nats, "product")
    try:
        for subject, payload in forged.items():
            assert await product.refused_publish(subject, payload), subject
        # Nor may it drive JetStream: delete or purge a stream, read its info.
        for api in (f"STREAM.DELETE.{next(iter(catalogue.streams))}", "STREAM.LIST", "INFO"):
            with pytest.raises(NatsTimeoutError):
                await product.nc.request(f"$JS.API.{api}", b"", timeout=0.5)
        assert product.nc.is_connected  # refused, not disconnected: its allowed publishes go on
    finally:
        await product.close()
    for stream in catalogue.streams:
        assert await stream_count(nats_client, stream) == 0, stream


async def test_product_reads_nothing(servers: Servers, nats_client, isolation):
    catalogue = Catalogue(isolation["namespace"])
    js = nats_client.jetstream()
    await ensure_topology(js, catalogue)
    spec = catalogue.consumer("evaluator-requests")
    await ensure_consumer(js, spec)

    product = await Probe.connect(servers.nats, "product")
    try:
        received: list[str] = []

        async def got(msg) -> None:
            received.append(msg.subject)

        wanted = [">", f"{catalogue.namespace}.evaluator.request.>", f"{catalogue.namespace}.>", "_INBOX_evaluator.>"]
        for subject in wanted:
            await product.nc.subscribe(subject, cb=got)
        await product.nc.flush()
        await js.publish(catalogue.evaluation_request("run-1"), evaluation_request("run-1").SerializeToString())
        await nats_client.publish("_INBOX_evaluator.anything", b"a reply meant for the evaluator")
        await nats_client.flush()

        # Pulling from the evaluator's durable consumer is refused too.
        pull = await product.nc.jetstream().pull_subscribe_bind(spec.durable, spec.stream)
        with pytest.raises(NatsTimeoutError):
            await pull.fetch(1, timeout=1.0)
        await asyncio.sleep(0.3)

        assert received == []
        assert sorted(product.violations("subscription")) == sorted(s.lower() for s in wanted)
        assert f"$js.api.consumer.msg.next.{spec.stream}.{spec.durable}".lower() in product.violations("publish")
    finally:
        await product.close()
    # The request is still waiting for a real evaluator.
    assert (await js.consumer_info(spec.stream, spec.durable)).num_pending == 1


async def test_only_the_optimizer_may_publish_evaluation_requests(servers: Servers, nats_client, isolation):
    catalogue = Catalogue(isolation["namespace"])
    await ensure_topology(nats_client.jetstream(), catalogue)
    subject = catalogue.evaluation_request("run-1")
    stream = catalogue.consumer("evaluator-requests").stream
    for role in ("evaluator", "trace_store", "society", "trainer"):
        probe = await Probe.connect(servers.nats, role)
        try:
            assert await probe.refused_publish(subject, evaluation_request("run-1").SerializeToString()), role
        finally:
            await probe.close()
    assert await stream_count(nats_client, stream) == 0

    optimizer = await Probe.connect(servers.nats, "optimizer")
    try:
        ack = await optimizer.nc.jetstream().publish(subject, evaluation_request("run-1").SerializeToString())
        assert ack.stream == stream
        # ...but not feedback: that is the product's to give.
        assert await optimizer.refused_publish(catalogue.feedback("support-bot"), b"{}")
    finally:
        await optimizer.close()
    assert await stream_count(nats_client, stream) == 1


async def test_a_server_pinned_to_one_namespace_refuses_the_others(tmp_path: Path):
    """The local stack pins its users to its namespace (`flywheel`); tests share a server that
    allows any, so this one gets a server of its own."""
    server = NatsServer(tmp_path / "pinned", namespace="flywheel")
    await asyncio.to_thread(server.start)
    try:
        admin = await nats.connect(server.url, user=server.user, password=server.password)
        try:
            for ns in ("flywheel", "other"):
                await ensure_topology(admin.jetstream(), Catalogue(ns))
            product = await Probe.connect(server, "product")
            try:
                ack = await product.nc.jetstream().publish(Catalogue("flywheel").feedback("bot"), b"{}")
                assert ack.stream == "FLYWHEEL_FEEDBACK"
                assert await product.refused_publish(Catalogue("other").feedback("bot"), b"{}")
            finally:
                await product.close()
            # A service's user is pinned as well: it may not even look at another namespace's streams.
            optimizer = await Probe.connect(server, "optimizer")
            try:
                await ensure_topology(optimizer.nc.jetstream(), Catalogue("flywheel"))
                with pytest.raises(NatsTimeoutError):
                    await ensure_topology(optimizer.nc.jetstream(), Catalogue("other"))
            finally:
                await optimizer.close()
        finally:
            await admin.close()
    finally:
        await asyncio.to_thread(server.stop)


def test_roles_cover_the_catalogue_and_name_one_writer_per_job():
    """The declaration itself: every durable consumer has exactly one owning role, every produced
    subject is stored by a stream, and the product's allow-lists hold feedback and spans only."""
    catalogue = Catalogue("flywheel")
    owners = [d for spec in ROLES.values() for d in spec.consumes]
    assert sorted(owners) == sorted(catalogue.consumers)
    product = role_permissions("product", "flywheel")
    assert product is not None
    assert product.publish == ("flywheel.product.feedback.*", "flywheel.product.traces.*")
    assert product.subscribe == ("_INBOX.>",)
    may_request = [
        role
        for role in ROLES
        if (perms := role_permissions(role, None)) is None or "*.evaluator.request.*" in perms.publish
    ]
    assert may_request == ["optimizer", "admin"]
    assert role_permissions("reward_judge", "flywheel") == Permissions((), ())


class StreamsMadeByAdmin(NatsServer):
    """A server whose service users may look at streams but not create or change them: what a
    deployment gets when its admin declares the streams and the services' CREATE/UPDATE go."""

    def authorization(self) -> dict:
        config = super().authorization()
        for user in config["users"]:
            if "permissions" in user:
                allow = user["permissions"]["publish"]["allow"]
                allow[:] = [s for s in allow if not s.startswith(("$JS.API.STREAM.CREATE.", "$JS.API.STREAM.UPDATE."))]
        return config


async def test_services_need_only_stream_info_once_the_admin_made_the_streams(tmp_path: Path):
    server = StreamsMadeByAdmin(tmp_path / "admin-streams", namespace="flywheel")
    await asyncio.to_thread(server.start)
    try:
        admin = await nats.connect(server.url, user=server.user, password=server.password)
        optimizer = await Probe.connect(server, "optimizer")
        try:
            with pytest.raises(NatsTimeoutError):  # nothing there yet, and it may not create
                await ensure_topology(optimizer.nc.jetstream(), Catalogue("flywheel"))
            await ensure_topology(admin.jetstream(), Catalogue("flywheel"))
            optimizer.errors.clear()
            # Unchanged streams are left alone: declaring them again needs STREAM.INFO only.
            await ensure_topology(optimizer.nc.jetstream(), Catalogue("flywheel"))
            assert optimizer.errors == []
        finally:
            await optimizer.close()
            await admin.close()
    finally:
        await asyncio.to_thread(server.stop)
