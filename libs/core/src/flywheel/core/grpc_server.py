"""The gRPC server every service runs: TLS and bearer-token auth from settings, domain
errors mapped to status codes, per-method metrics and log context, plus the standard
health and reflection services."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
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


class _Guard:
    """Auth, error mapping, metrics and log context around every method of the service's own
    servicers. The handlers are wrapped once, when the servicers register (see ``_Registrar``),
    not per call by a grpc.aio interceptor: an interceptor costs an extra coroutine and a new
    handler object on every call, the hot path's most expensive Python after grpc itself."""

    def __init__(self, auth_token: str | None) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None

    def wrap(self, method: str, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None or method.startswith(_UNAUTHENTICATED_PREFIXES):
            return handler
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _authorized(self, context: grpc.aio.ServicerContext) -> bool:
        if self._expected is None:
            return True
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                raw = value if isinstance(value, bytes) else value.encode()
                return hmac.compare_digest(raw, self._expected)
        return False

    @staticmethod
    async def _fail(context: grpc.aio.ServicerContext, method: str, exc: ServiceError) -> None:
        RPC_TOTAL.labels(method, exc.code.name).inc()
        await context.abort(exc.code, str(exc))

    @staticmethod
    async def _refuse(context: grpc.aio.ServicerContext, method: str) -> None:
        RPC_TOTAL.labels(method, "UNAUTHENTICATED").inc()
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _wrap_unary(self, fn: Any, method: str) -> Any:
        ok = RPC_TOTAL.labels(method, "OK")
        seconds = RPC_SECONDS.labels(method)

        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._authorized(context):
                await self._refuse(context, method)
            started = time.perf_counter()
            with bound(rpc=method):
                try:
                    response = await fn(request, context)
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                ok.inc()
                seconds.observe(time.perf_counter() - started)
                return response

        return wrapper

    def _wrap_stream(self, fn: Any, method: str) -> Any:
        ok = RPC_TOTAL.labels(method, "OK")

        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._authorized(context):
                await self._refuse(context, method)
            with bound(rpc=method):
                try:
                    async for item in fn(request, context):
                        yield item
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                ok.inc()

        return wrapper


class _GuardedGenericHandler(grpc.GenericRpcHandler):
    """A servicer's generic handler with each method's handler wrapped once (cached)."""

    def __init__(self, inner: grpc.GenericRpcHandler, guard: _Guard) -> None:
        self._inner = inner
        self._guard = guard
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        try:
            return self._handlers[method]
        except KeyError:
            handler = self._guard.wrap(method, self._inner.service(handler_call_details))
            self._handlers[method] = handler
            return handler


class _Registrar:
    """What ``add_XServicer_to_server`` sees instead of the server: it registers the servicer's
    handlers on the real server, guarded."""

    def __init__(self, server: grpc.aio.Server, guard: _Guard) -> None:
        self._server = server
        self._guard = guard

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_GuardedGenericHandler(h, self._guard) for h in generic_rpc_handlers)
        )

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, Any]) -> None:
        self._server.add_registered_method_handlers(
            service_name,
            {name: self._guard.wrap(f"/{service_name}/{name}", h) for name, h in method_handlers.items()},
        )


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
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 32 * 1024 * 1024)])
    registrar = _Registrar(server, _Guard(token))
    for add, servicer, _ in servicers:
        add(servicer, registrar)
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
