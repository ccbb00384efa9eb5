"""The gRPC server every service runs: TLS and bearer-token auth from settings, domain
errors mapped to status codes, per-method metrics and log context, plus the standard
health and reflection services."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from flywheel.core.errors import ServiceError
from flywheel.core.logging import bound, get_logger
from flywheel.core.metrics import RPC_SECONDS, RPC_TOTAL
from flywheel.core.settings import ServiceSettings

log = get_logger(__name__)

# Probes must work without credentials (kubelet's gRPC probe sends none).
_UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class _ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth_token: str | None) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(_UNAUTHENTICATED_PREFIXES):
            return handler
        authorized = self._authorized(details)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method, authorized),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method, authorized),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, method, authorized),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        if self._expected is None:
            return True
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                raw = value if isinstance(value, bytes) else value.encode()
                return hmac.compare_digest(raw, self._expected)
        return False

    @staticmethod
    async def _fail(context: grpc.aio.ServicerContext, method: str, exc: ServiceError) -> None:
        RPC_TOTAL.labels(method, exc.code.name).inc()
        await context.abort(exc.code, str(exc))

    def _wrap_unary(self, fn: Any, method: str, authorized: bool) -> Any:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not authorized:
                RPC_TOTAL.labels(method, "UNAUTHENTICATED").inc()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            started = time.perf_counter()
            with bound(rpc=method):
                try:
                    response = await fn(request, context)
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                RPC_TOTAL.labels(method, "OK").inc()
                RPC_SECONDS.labels(method).observe(time.perf_counter() - started)
                return response

        return wrapper

    def _wrap_stream(self, fn: Any, method: str, authorized: bool) -> Any:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not authorized:
                RPC_TOTAL.labels(method, "UNAUTHENTICATED").inc()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            with bound(rpc=method):
                try:
                    async for item in fn(request, context):
                        yield item
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                RPC_TOTAL.labels(method, "OK").inc()

        return wrapper


def _credentials(settings: ServiceSettings) -> grpc.ServerCredentials | None:
    if not (settings.tls_cert_file and settings.tls_key_file):
        return None
    client_ca = settings.tls_client_ca_file.read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def build_server(
    settings: ServiceSettings,
    servicers: list[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]],
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Create the server with the service's servicers, health and reflection; bind the port.

    ``servicers`` holds (add_XServicer_to_server, servicer, full service name).
    Returns the server (not started), its health servicer and the bound port.
    """
    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    server = grpc.aio.server(
        interceptors=[_ServerInterceptor(token)],
        options=[("grpc.max_receive_message_length", 32 * 1024 * 1024)],
    )
    for add, servicer, _ in servicers:
        add(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [name for _, _, name in servicers]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    creds = _credentials(settings)
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    return server, health_servicer, port
