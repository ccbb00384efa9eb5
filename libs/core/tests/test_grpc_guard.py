"""The gRPC guard on both servers (grpc.aio and the sync thread pool): bytes that do not parse
answer INVALID_ARGUMENT naming the message, an unexpected error answers INTERNAL with an error
id and never its text (a database error's SQL and parameters stay in the log), a dependency that
is away or slow (a connect timeout, a refused connection) answers UNAVAILABLE, which callers
retry, with an id and no text, a domain error keeps its code and message, and a bridged call
whose loop never answers ends at its deadline."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as pb_grpc
from flywheel.core.errors import NotFound
from flywheel.core.grpc_server import _Guard, _Registrar

SQL_ERROR = (
    "(sqlalchemy.dialects.postgresql.asyncpg.Error) <class 'asyncpg.exceptions.CharacterNotInRepertoireError'>: "
    "invalid byte sequence [SQL: INSERT INTO decisions (decision_id, user_id) VALUES ($1, $2)] "
    "[parameters: ('d1', 'secret-user')]"
)


class Servicer(pb_grpc.EndpointAdminServiceServicer):
    async def GetEndpoint(self, request: pb.GetEndpointRequest, context: grpc.aio.ServicerContext):
        if request.name == "missing":
            raise NotFound("endpoint 'missing' does not exist")
        if request.name == "hang":
            await asyncio.sleep(30)
        if request.name == "sql":
            raise RuntimeError(SQL_ERROR)
        if request.name == "db-away":  # what SQLAlchemy raises when asyncpg's connect times out
            raise RuntimeError(SQL_ERROR) from TimeoutError()
        if request.name == "refused":
            raise ConnectionRefusedError(111, "Connect call failed ('10.0.0.7', 5432)")
        if request.name == "no-file":
            raise FileNotFoundError(2, "No such file or directory", "/etc/flywheel/model.bin")
        return pb.GetEndpointResponse()


@pytest.fixture(params=["aio", "sync"])
async def address(request):
    loop = asyncio.get_running_loop()
    if request.param == "aio":
        server = grpc.aio.server()
        guard = _Guard(None)
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        guard = _Guard(None, loop, bridge_timeout_s=0.5)
    pb_grpc.add_EndpointAdminServiceServicer_to_server(Servicer(), _Registrar(server, guard))
    port = server.add_insecure_port("127.0.0.1:0")
    if request.param == "aio":
        await server.start()
    else:
        server.start()
    yield f"127.0.0.1:{port}", request.param
    if request.param == "aio":
        await server.stop(None)
    else:
        await asyncio.to_thread(server.stop(None).wait)


async def call_raw(address: str, payload: bytes) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.unary_unary(
            "/flywheel.api.optimizer.v1.EndpointAdminService/GetEndpoint",
            request_serializer=lambda b: b,
            response_deserializer=pb.GetEndpointResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(payload, timeout=5.0)
    return info.value


async def test_undecodable_bytes_are_invalid_argument_naming_the_message(address):
    addr, _ = address
    for payload in (b"\x0a\xff\xff\xff\xff\x0f", b"\xff"):  # truncated, bad tag
        error = await call_raw(addr, payload)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (payload, error.details())
        assert "request body is not a valid flywheel.api.optimizer.v1.GetEndpointRequest" in error.details()
    error = await call_raw(addr, b"\x0a\x02\xc3\x28")  # name = 2 bytes of bad UTF-8: the field is named
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "name: is not valid UTF-8 (request flywheel.api.optimizer.v1.GetEndpointRequest)"
    # ... and the server goes on answering good requests.
    async with grpc.aio.insecure_channel(addr) as channel:
        await pb_grpc.EndpointAdminServiceStub(channel).GetEndpoint(pb.GetEndpointRequest(name="ok"))


async def test_an_unexpected_error_is_internal_with_an_id_and_no_sql(address, capsys):
    addr, _ = address
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.EndpointAdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetEndpoint(pb.GetEndpointRequest(name="sql"))
        details = info.value.details()
        assert info.value.code() == grpc.StatusCode.INTERNAL
        for leak in ("INSERT", "SQL", "parameters", "secret-user", "asyncpg", "Traceback"):
            assert leak not in details, details
        assert "error_id=" in details
        error_id = details.rsplit("error_id=", 1)[1]
        # The full error is in the service's log, under the id the caller got.
        logged = capsys.readouterr()
        assert error_id in logged.err + logged.out
        assert "INSERT INTO decisions" in logged.err + logged.out

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetEndpoint(pb.GetEndpointRequest(name="missing"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "endpoint 'missing' does not exist"


async def test_a_dependency_away_is_unavailable_with_an_id_and_a_bug_stays_internal(address, capsys):
    addr, _ = address
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.EndpointAdminServiceStub(channel)
        for name, code in (
            ("db-away", grpc.StatusCode.UNAVAILABLE),
            ("refused", grpc.StatusCode.UNAVAILABLE),
            ("no-file", grpc.StatusCode.INTERNAL),  # an OSError, but a file's, not a dependency's
            ("sql", grpc.StatusCode.INTERNAL),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetEndpoint(pb.GetEndpointRequest(name=name))
            details = info.value.details()
            assert info.value.code() == code, (name, details)
            for leak in ("INSERT", "secret-user", "10.0.0.7", "/etc/flywheel", "Traceback"):
                assert leak not in details, details
            error_id = details.rsplit("error_id=", 1)[1]
            assert error_id in "".join(capsys.readouterr()), name
        await stub.GetEndpoint(pb.GetEndpointRequest(name="ok"))


async def test_a_bridged_call_that_never_finishes_ends_at_its_deadline(address):
    addr, kind = address
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.EndpointAdminServiceStub(channel)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            # No deadline from the caller: the sync server's bridge gives up after its 0.5 s.
            await stub.GetEndpoint(pb.GetEndpointRequest(name="hang"), timeout=None if kind == "sync" else 1.0)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert loop.time() - started < 5
        await stub.GetEndpoint(pb.GetEndpointRequest(name="ok"))


def _ld(field: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                return bytes(out)

    return varint(field << 3 | 2) + varint(len(payload)) + payload


def test_too_deep_and_bad_utf8_are_named_by_the_wire_walk():
    from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
    from flywheel.core.validation import undecodable_reason

    struct = b""
    for _ in range(150):  # context nested 150 levels: protobuf refuses it without naming it
        struct = _ld(1, _ld(1, b"k") + _ld(2, _ld(5, struct)))
    reason = undecodable_reason(sel_pb.SelectRequest.DESCRIPTOR, _ld(1, b"e") + _ld(3, struct))
    assert reason is not None and reason.startswith("context.fields[0].value.struct_value")
    assert reason.endswith("is nested more than 90 messages deep")
    batch = _ld(1, _ld(1, b"e")) + _ld(1, _ld(1, b"e") + _ld(2, b"\xff\xfe"))
    assert undecodable_reason(sel_pb.SelectBatchRequest.DESCRIPTOR, batch) == "requests[1].user_id: is not valid UTF-8"
