"""The gRPC server every service runs: TLS and bearer-token auth from settings, domain
errors mapped to status codes, per-method metrics and log context, plus the standard
health and reflection services."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from flywheel.core.errors import InvalidArgument, ServiceError, is_transient
from flywheel.core.logging import bound, get_logger
from flywheel.core.metrics import RPC_SECONDS, RPC_TOTAL
from flywheel.core.settings import ServiceSettings
from flywheel.core.validation import undecodable_reason

log = get_logger(__name__)

# Probes must work without credentials (kubelet's gRPC probe sends none).
_UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# How long a worker thread of the sync server waits for a call it handed to the event loop when
# the caller set no deadline: no thread waits forever on a loop that never answers.
BRIDGE_TIMEOUT_S = 60.0


class _Undecodable:
    """What the guarded deserializer returns for bytes that do not parse: the method then
    answers INVALID_ARGUMENT (grpc's own answer to a raising deserializer is INTERNAL)."""

    __slots__ = ("message", "reason")

    def __init__(self, message: str, reason: str | None = None) -> None:
        self.message = message
        self.reason = reason

    def error(self) -> InvalidArgument:
        if self.reason:
            return InvalidArgument(f"{self.reason} (request {self.message})")
        return InvalidArgument(f"request body is not a valid {self.message}")


def _guarded_deserializer(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    owner = getattr(deserializer, "__self__", None)  # Message.FromString is bound to its class
    descriptor = getattr(owner, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None) or "request message"

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # noqa: BLE001 - DecodeError, invalid UTF-8 in a string field, ...
            # Only now, on the failure path: find the string field with bad UTF-8, if that is it.
            return _Undecodable(name, undecodable_reason(descriptor, data) if descriptor is not None else None)

    return deserialize


class _Aborted(Exception):
    """Raised by ``_AioContext.abort``: the call has its status already; pass it through."""


def _details(exc: ServiceError) -> str:
    """The message a caller gets: short enough for a gRPC trailer (16 KiB), however long the
    value it quotes (a 1 MB name echoed back would end the call with RESOURCE_EXHAUSTED)."""
    text = str(exc)
    return text if len(text) <= _MAX_DETAILS else text[: _MAX_DETAILS - 20] + "... (truncated)"


_MAX_DETAILS = 2000


def _sync_aborted(context: Any) -> bool:
    """Whether a sync server's context was aborted (its abort raises a bare Exception)."""
    return bool(getattr(getattr(context, "_state", None), "aborted", False))


def _internal(method: str, exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """An unexpected error: logged here in full with an id, answered with the id only, so a
    database error's SQL and parameters (or a stack trace) never reach the caller.

    A dependency that is away or slow (PostgreSQL's connect timing out, a lost connection, NATS
    reconnecting: ``is_transient``) answers UNAVAILABLE, which callers and the SDK retry; a bug
    answers INTERNAL, which they do not."""
    error_id = uuid.uuid4().hex[:16]
    if is_transient(exc):
        log.warning("dependency unavailable", rpc=method, error_id=error_id, error=repr(exc), exc_info=exc)
        RPC_TOTAL.labels(method, "UNAVAILABLE").inc()
        return (
            grpc.StatusCode.UNAVAILABLE,
            f"a dependency is unavailable, try again; the service logged it as error_id={error_id}",
        )
    log.error("unexpected error", rpc=method, error_id=error_id, error=repr(exc), exc_info=exc)
    RPC_TOTAL.labels(method, "INTERNAL").inc()
    return grpc.StatusCode.INTERNAL, f"internal error; the service logged it as error_id={error_id}"


class _Guard:
    """Auth, error mapping, metrics and log context around every method of the service's own
    servicers. The handlers are wrapped once, when the servicers register (see ``_Registrar``),
    not per call by a grpc.aio interceptor: an interceptor costs an extra coroutine and a new
    handler object on every call, the hot path's most expensive Python after grpc itself."""

    def __init__(
        self,
        auth_token: str | None,
        loop: asyncio.AbstractEventLoop | None = None,
        max_streams: int = 4,
        bridge_timeout_s: float = BRIDGE_TIMEOUT_S,
    ) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None
        self._bridge_timeout_s = bridge_timeout_s
        self._loop = loop  # set for the sync server: where async servicer methods run
        self._max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    def wrap(self, method: str, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None or method.startswith(_UNAUTHENTICATED_PREFIXES):
            return handler
        deserializer = _guarded_deserializer(handler.request_deserializer)
        if self._loop is not None:
            return self._wrap_for_sync_server(method, handler, self._loop, deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, method, client_streaming=True),
                request_deserializer=deserializer,
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
        await context.abort(exc.code, _details(exc))

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
                    if request.__class__ is _Undecodable:
                        raise request.error()
                    response = await fn(request, context)
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                except (grpc.aio.AbortError, _Aborted):
                    raise
                except Exception as exc:  # a bug (INTERNAL) or a dependency away (UNAVAILABLE), with an id
                    if _sync_aborted(context):
                        raise
                    await context.abort(*_internal(method, exc))
                ok.inc()
                seconds.observe(time.perf_counter() - started)
                return response

        return wrapper

    def _wrap_stream(self, fn: Any, method: str, *, client_streaming: bool = False) -> Any:
        ok = RPC_TOTAL.labels(method, "OK")

        async def decoded(requests: Any) -> Any:
            async for request in requests:
                if request.__class__ is _Undecodable:
                    raise request.error()
                yield request

        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._authorized(context):
                await self._refuse(context, method)
            with bound(rpc=method):
                try:
                    if client_streaming:
                        request = decoded(request)
                    elif request.__class__ is _Undecodable:
                        raise request.error()
                    async for item in fn(request, context):
                        yield item
                except ServiceError as exc:
                    await self._fail(context, method, exc)
                except (grpc.aio.AbortError, _Aborted):
                    raise
                except Exception as exc:  # a bug (INTERNAL) or a dependency away (UNAVAILABLE), with an id
                    if _sync_aborted(context):
                        raise
                    await context.abort(*_internal(method, exc))
                ok.inc()

        return wrapper

    def _wrap_for_sync_server(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        loop: asyncio.AbstractEventLoop,
        deserializer: Callable[[bytes], Any] | None,
    ) -> grpc.RpcMethodHandler:
        kw = {"request_deserializer": deserializer, "response_serializer": handler.response_serializer}
        timeout_s = self._bridge_timeout_s
        if handler.unary_unary:
            fn = handler.unary_unary
            twin = getattr(getattr(fn, "__self__", None), f"{getattr(fn, '__name__', '')}_sync", None)
            if twin is not None or not inspect.iscoroutinefunction(fn):
                return grpc.unary_unary_rpc_method_handler(self._wrap_unary_sync(twin or fn, method), **kw)
            guarded = self._wrap_unary(fn, method)

            def bridged(request: Any, context: grpc.ServicerContext) -> Any:
                return _on_loop(guarded(request, _AioContext(context)), loop, context, timeout_s)

            return grpc.unary_unary_rpc_method_handler(bridged, **kw)
        if handler.unary_stream:
            guarded_stream = self._wrap_stream(handler.unary_stream, method)

            def bridged_stream(request: Any, context: grpc.ServicerContext) -> Any:
                # A stream holds a worker thread for as long as it lasts: past the cap, refuse it
                # rather than let watchers take every thread Select needs.
                if not self._streams.acquire(blocking=False):
                    RPC_TOTAL.labels(method, "RESOURCE_EXHAUSTED").inc()
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"{self._max_streams} streams are open, the most this server takes (grpc_workers / 2)",
                    )
                # One task iterates the async generator (its log context spans its yields, so it
                # must stay in one task) and hands each item to this thread through a queue.
                items: queue.SimpleQueue[Any] = queue.SimpleQueue()

                async def pump() -> None:
                    async for item in guarded_stream(request, _AioContext(context)):
                        items.put(item)

                future = asyncio.run_coroutine_threadsafe(pump(), loop)
                future.add_done_callback(items.put)  # however it ends (even cancelled before it began)
                context.add_callback(future.cancel)  # the call ended (cancelled, deadline): stop the task
                try:
                    while (item := _next_item(items, context, timeout_s)) is not future:
                        yield item
                    if not future.cancelled() and future.exception() is not None:
                        raise future.exception()  # type: ignore[misc]
                finally:
                    future.cancel()
                    self._streams.release()

            return grpc.unary_stream_rpc_method_handler(bridged_stream, **kw)
        raise NotImplementedError(f"{method}: client-streaming methods need grpc_server=aio")

    def _wrap_unary_sync(self, fn: Any, method: str) -> Any:
        ok = RPC_TOTAL.labels(method, "OK")
        seconds = RPC_SECONDS.labels(method)

        def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
            if not self._authorized(context):  # type: ignore[arg-type]
                RPC_TOTAL.labels(method, "UNAUTHENTICATED").inc()
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            started = time.perf_counter()
            with bound(rpc=method):
                try:
                    if request.__class__ is _Undecodable:
                        raise request.error()
                    response = fn(request, context)
                except ServiceError as exc:
                    RPC_TOTAL.labels(method, exc.code.name).inc()
                    context.abort(exc.code, _details(exc))
                except Exception as exc:  # a bug (INTERNAL) or a dependency away (UNAVAILABLE), with an id
                    if _sync_aborted(context):
                        raise
                    context.abort(*_internal(method, exc))
                ok.inc()
                seconds.observe(time.perf_counter() - started)
                return response

        return wrapper


def _wait_s(context: grpc.ServicerContext, timeout_s: float) -> float:
    """How long a worker may wait for the loop: the call's remaining deadline, else ``timeout_s``."""
    remaining = context.time_remaining()  # grpcio answers a huge number when there is no deadline
    if remaining is None or remaining > 1e6:
        return timeout_s
    return max(0.0, min(remaining, 10 * timeout_s))


def _on_loop(coro: Any, loop: asyncio.AbstractEventLoop, context: grpc.ServicerContext, timeout_s: float) -> Any:
    """Run ``coro`` on the event loop and wait for it in this worker thread; when the call ends
    first (the client cancelled, or its deadline passed), the coroutine is cancelled too. The
    wait is bounded by the call's deadline (``timeout_s`` when it has none): past it the
    coroutine is cancelled and the call answers DEADLINE_EXCEEDED."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    context.add_callback(future.cancel)
    wait_s = _wait_s(context, timeout_s)
    try:
        return future.result(timeout=wait_s)
    except futures.TimeoutError:
        future.cancel()
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"the call did not finish within {wait_s:.1f}s")


def _next_item(items: queue.SimpleQueue[Any], context: grpc.ServicerContext, timeout_s: float) -> Any:
    """The next item a stream's task hands over. A stream may be quiet for long (a watch), so
    there is no overall bound without a deadline; but the wait re-checks every second that the
    call is still alive and its deadline not passed, so the thread never outlives its call."""
    while True:
        try:
            return items.get(timeout=1.0)
        except queue.Empty:
            remaining = context.time_remaining()
            if not context.is_active() or (remaining is not None and remaining <= 0):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the stream ended: the call is over")


class _AioContext:
    """A sync server's context, with the awaitable ``abort`` async servicers call."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        try:
            self._context.abort(code, details)
        except Exception:  # noqa: BLE001 - the sync context raises a bare Exception; the status is set
            raise _Aborted() from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _SyncServer:
    """grpc.server with the awaitable start/stop that ``lifecycle.serve`` uses."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    async def start(self) -> None:
        self._server.start()

    async def stop(self, grace: float | None) -> None:
        done = self._server.stop(grace)
        await asyncio.to_thread(done.wait)


class _SyncHealth:
    """The sync health servicer, with the awaitable methods ``Readiness`` calls."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer()

    async def set(self, service: str, status: int) -> None:
        self.servicer.set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        self.servicer.enter_graceful_shutdown()


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
    options = [("grpc.max_receive_message_length", 32 * 1024 * 1024)]
    sync = settings.grpc_server == "sync"
    server: Any
    if sync:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.grpc_workers), options=options)
        guard = _Guard(token, asyncio.get_running_loop(), max_streams=max(1, settings.grpc_workers // 2))
    else:
        server = grpc.aio.server(options=options)
        guard = _Guard(token)
    registrar = _Registrar(server, guard)
    for add, servicer, _ in servicers:
        add(servicer, registrar)
    health_servicer: Any
    if sync:
        health_servicer = _SyncHealth()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer.servicer, server)
    else:
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [name for _, _, name in servicers]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    host = settings.grpc_host
    # An IPv6 address (::, ::1) needs brackets before the port.
    address = (
        f"[{host}]:{settings.grpc_port}" if ":" in host and not host.startswith("[") else f"{host}:{settings.grpc_port}"
    )
    creds = _credentials(settings)
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    return (_SyncServer(server) if sync else server), health_servicer, port
