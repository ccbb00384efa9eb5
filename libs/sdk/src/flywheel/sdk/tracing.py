"""Agent traces from products: ``trace``/span helpers and an instrumenting wrapper.

    tracer = configure_tracing(nats_url="nats://127.0.0.1:4222", agent="support-bot")
    with flywheel.sdk.trace("answer a ticket", user_id="u-1", decision_id=d.decision_id):
        with prompt("chat", model="gpt-4o-mini", input=question) as p:
            answer = llm(question)
            p.output, p.input_tokens, p.output_tokens = answer, 12, 40
        with tool("search", input='{"q": "reset"}') as t:
            t.output = search("reset")
        reward(0.8, name="judge")          # on its own scale: reward(7, min=0, max=10)
    tracer.flush()                         # optional: block until JetStream stored every span

    agent = instrument(agent)              # or instrument(agent, method="chat")

Spans are OpenTelemetry-shaped (16-byte trace ids, 8-byte span ids, hex) and are
published in batches (``SpanBatch``) on ``<namespace>.product.traces.<agent>`` from a
background thread, so tracing never blocks the agent; ``flush`` waits for JetStream's
acks. The queue is bounded: while NATS is unreachable the oldest batches are dropped and
a batch is given up after ``give_up_after_s``, both counted in ``tracer.stats()``. The
current trace and span live in context variables, so nesting works across threads' own
contexts and asyncio tasks.

``instrument`` wraps an agent's chat method (sync, async, sync generator or async
generator, i.e. streaming) without changing the agent's code. Each call becomes a
prompt span (input: the last user message; output: the streamed content; model and
token usage when given) with content, reasoning and tool spans under it. A tool span is
closed with its *result* when the result shows up, either as a ``tool_result`` chunk or
as a ``role: tool`` message in the next call's messages (MassGen's RL mixins never
recorded those, nor the prompt spans).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1.spans_pb2 import Span, SpanBatch, SpanKind, SpanStatus

__all__ = [
    "SpanHandle",
    "Tracer",
    "TracerStats",
    "configure_tracing",
    "content",
    "coordination",
    "instrument",
    "prompt",
    "reasoning",
    "reward",
    "tool",
    "trace",
]

_current: contextvars.ContextVar[SpanHandle | None] = contextvars.ContextVar("flywheel_span", default=None)
_default: Tracer | None = None
_log = logging.getLogger(__name__)


class SpanHandle:
    """An open span: set ``input``, ``output``, ``model``, token counts, ``cost_usd`` or
    ``attributes`` while it runs; it is emitted when its block ends (an exception marks it
    as an error and propagates)."""

    def __init__(
        self, tracer: Tracer, kind: int, name: str, *, parent: SpanHandle | None = None, **fields: Any
    ) -> None:
        self.tracer = tracer
        self.span = Span(
            trace_id=parent.span.trace_id if parent else secrets.token_hex(16),
            span_id=secrets.token_hex(8),
            parent_span_id=parent.span.span_id if parent else "",
            kind=kind,  # type: ignore[arg-type]
            name=name,
            agent=fields.pop("agent", None) or (parent.span.agent if parent else tracer.agent),
            decision_id=fields.pop("decision_id", None) or (parent.span.decision_id if parent else ""),
            user_id=fields.pop("user_id", None) or (parent.span.user_id if parent else ""),
            endpoint=fields.pop("endpoint", None) or (parent.span.endpoint if parent else ""),
        )
        self.span.start_time.GetCurrentTime()
        self.attributes: dict[str, Any] = fields.pop("attributes", None) or {}
        for key, value in fields.items():
            setattr(self, key, value)
        self._token: contextvars.Token[SpanHandle | None] | None = None
        self._ended = False

    # Plain fields of the span, settable as attributes of the handle.
    _FIELDS = frozenset({"input", "output", "model", "input_tokens", "output_tokens", "cost_usd"})

    def __setattr__(self, key: str, value: Any) -> None:
        if key in SpanHandle._FIELDS:
            setattr(self.span, key, value if key in ("input_tokens", "output_tokens", "cost_usd") else str(value))
        else:
            object.__setattr__(self, key, value)

    def __getattr__(self, key: str) -> Any:
        if key in SpanHandle._FIELDS:
            return getattr(self.span, key)
        raise AttributeError(key)

    @property
    def trace_id(self) -> str:
        return self.span.trace_id

    @property
    def span_id(self) -> str:
        return self.span.span_id

    def end(self, *, error: BaseException | None = None) -> None:
        """Close and emit the span (once)."""
        if self._ended:
            return
        self._ended = True
        self.span.end_time.GetCurrentTime()
        self.span.status = SpanStatus.SPAN_STATUS_ERROR if error else SpanStatus.SPAN_STATUS_OK
        if error is not None:
            self.attributes.setdefault("error", repr(error)[:1000])
        if self.attributes:
            self.span.attributes.update(json.loads(json.dumps(self.attributes, default=str)))
        self.tracer.emit(self.span)

    def __enter__(self) -> SpanHandle:
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._token is not None:
            _current.reset(self._token)
        if self.span.kind != SpanKind.SPAN_KIND_REWARD:
            self.end(error=exc)
        if not self.span.parent_span_id:
            self.tracer.close_pending_tools(self.span.trace_id)

    async def __aenter__(self) -> SpanHandle:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


@dataclass(frozen=True)
class TracerStats:
    """What the tracer did with the spans it was given (``Tracer.stats()``)."""

    published_spans: int
    queued_spans: int
    queued_batches: int
    # Dropped because the queue was full (the oldest batch goes first) ...
    dropped_spans: int
    dropped_batches: int
    # ... or because publishing a batch kept failing for ``give_up_after_s``.
    expired_spans: int
    expired_batches: int
    last_error: str


class Tracer:
    """Publishes spans in batches to JetStream from a background thread.

    Bounded in the product's process: spans wait in at most ``max_queued_batches`` batches
    of ``max_batch`` spans (plus the one being published and the one being filled). When
    the queue is full, e.g. while NATS is unreachable, the *oldest* batch is dropped; a
    batch that cannot be published for ``give_up_after_s`` is given up. Both are counted
    (:meth:`stats`, ``dropped_spans``) and logged as a warning on the ``flywheel.sdk.tracing``
    logger at most once per ``drop_log_interval_s``; tracing never blocks or fails the agent.
    """

    def __init__(
        self,
        *,
        nats_url: str,
        agent: str,
        nats_user: str | None = None,
        nats_password: str | None = None,
        namespace: str = "flywheel",
        source: str = "sdk",
        flush_interval_s: float = 0.1,
        max_batch: int = 1000,
        max_queued_batches: int = 100,
        give_up_after_s: float = 60.0,
        publish_timeout_s: float = 5.0,
        drop_log_interval_s: float = 60.0,
    ) -> None:
        for name, value in (
            ("flush_interval_s", flush_interval_s),
            ("max_batch", max_batch),
            ("max_queued_batches", max_queued_batches),
            ("give_up_after_s", give_up_after_s),
            ("publish_timeout_s", publish_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"Tracer {name} must be > 0, got {value!r}")
        self.agent = agent
        self._catalogue = Catalogue(namespace)
        self._catalogue.traces(agent)  # fail fast on an agent name that cannot be a subject token
        self._connect = {"servers": [nats_url], "user": nats_user, "password": nats_password}
        self._source = source
        self._interval = flush_interval_s
        self._max_batch = max_batch
        self._max_queued = max_queued_batches
        self._give_up_s = give_up_after_s
        self._publish_timeout_s = publish_timeout_s
        self._log_every_s = drop_log_interval_s
        self._lock = threading.Condition()
        self._open: list[Span] = []  # the batch being filled
        self._batches: collections.deque[list[Span]] = collections.deque()  # sealed, oldest first
        self._pending = 0  # emitted, not yet published, dropped or given up
        self._published = 0
        self._dropped = [0, 0]  # spans, batches
        self._expired = [0, 0]
        self._last_log = 0.0
        self._unlogged = 0
        self._closed = False
        self._error: BaseException | None = None
        self._connect_error: BaseException | None = None
        self._tools: dict[str, SpanHandle] = {}  # open tool spans by tool call id
        self._thread = threading.Thread(target=self._run, name="flywheel-tracer", daemon=True)
        self._thread.start()

    # -- emitting -------------------------------------------------------------------------
    def emit(self, span: Span) -> None:
        """Queue a span; never blocks on the network (a full queue drops its oldest batch)."""
        with self._lock:
            self._pending += 1
            self._open.append(span)
            if len(self._open) >= self._max_batch:
                self._seal()

    def _seal(self) -> None:
        """Move the open batch to the queue, dropping the oldest one past the bound. Under the lock."""
        if not self._open:
            return
        self._batches.append(self._open)
        self._open = []
        while len(self._batches) > self._max_queued:
            oldest = self._batches.popleft()
            self._dropped[0] += len(oldest)
            self._dropped[1] += 1
            self._lost(len(oldest), "the tracer's queue is full (max_queued_batches)")

    def _lost(self, spans: int, why: str) -> None:
        """Account for spans that will never be published. Under the lock."""
        self._pending -= spans
        self._unlogged += spans
        self._lock.notify_all()
        now = time.monotonic()
        if now - self._last_log >= self._log_every_s:
            _log.warning(
                "flywheel tracer dropped %d spans since its last warning: %s; last error: %r "
                "(totals: %d dropped, %d given up)",
                self._unlogged,
                why,
                self._error,
                self._dropped[0],
                self._expired[0],
            )
            self._last_log, self._unlogged = now, 0

    def stats(self) -> TracerStats:
        """Counters of published, queued, dropped and given-up spans."""
        with self._lock:
            return TracerStats(
                published_spans=self._published,
                queued_spans=len(self._open) + sum(len(b) for b in self._batches),
                queued_batches=len(self._batches) + (1 if self._open else 0),
                dropped_spans=self._dropped[0],
                dropped_batches=self._dropped[1],
                expired_spans=self._expired[0],
                expired_batches=self._expired[1],
                last_error=repr(self._error) if self._error else "",
            )

    @property
    def dropped_spans(self) -> int:
        """Spans that will never reach Flywheel: dropped from a full queue or given up."""
        with self._lock:
            return self._dropped[0] + self._expired[0]

    def flush(self, timeout_s: float = 10.0) -> int:
        """Block until every span emitted so far is stored by JetStream, dropped or given up;
        returns how many were dropped or given up meanwhile (0: all stored)."""
        with self._lock:
            before = self._dropped[0] + self._expired[0]
            self._seal()
            if not self._lock.wait_for(lambda: self._pending == 0, timeout_s):
                raise TimeoutError(
                    f"{self._pending} spans not acknowledged within {timeout_s}s (last error: {self._error!r})"
                )
            return self._dropped[0] + self._expired[0] - before

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (up to ``timeout_s``) and stop the publishing thread; what is left is dropped."""
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            self._thread.join(timeout_s)

    def _run(self) -> None:
        asyncio.run(self._publish_loop())

    def _next(self) -> list[Span] | None:
        with self._lock:
            if not self._batches:
                self._seal()  # spans that waited one interval go out in a partial batch
            return self._batches.popleft() if self._batches else None

    async def _publish_loop(self) -> None:
        import nats  # lazily: only products that trace pay for importing it

        nc = None
        while True:
            with self._lock:
                if self._closed:
                    left = len(self._open) + sum(len(b) for b in self._batches)
                    self._open, self._batches = [], collections.deque()
                    if left:
                        self._dropped[0] += left
                        self._lost(left, "the tracer was closed before they were published")
                    break
            batch = self._next()
            if batch is None:
                await asyncio.sleep(self._interval)
                continue
            give_up = time.monotonic() + self._give_up_s
            delay = 0.1
            while True:
                remaining = give_up - time.monotonic()
                try:
                    if nc is None or nc.is_closed:
                        nc = await self._connect_within(nats, remaining)
                    await asyncio.wait_for(self._publish(nc.jetstream(), batch), max(0.01, remaining))
                except Exception as exc:  # noqa: BLE001 - keep the batch and retry until give_up_after_s
                    self._error = exc
                    if time.monotonic() + delay >= give_up or self._closed:
                        with self._lock:
                            self._expired[0] += len(batch)
                            self._expired[1] += 1
                            self._lost(len(batch), f"publishing failed for {self._give_up_s:g}s (give_up_after_s)")
                        break
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                with self._lock:
                    self._pending -= len(batch)
                    self._published += len(batch)
                    self._lock.notify_all()
                break
        if nc is not None and not nc.is_closed:
            # The server may be gone already: closing then fails on a dead socket, which is no
            # reason to raise in the customer's thread.
            with contextlib.suppress(Exception):
                await nc.close()

    async def _connect_within(self, nats: Any, remaining: float) -> Any:
        """A NATS client, or ConnectionError (with the server's last answer) past the time left."""
        self._connect_error = None
        try:
            return await asyncio.wait_for(
                nats.connect(
                    **self._connect,
                    connect_timeout=self._publish_timeout_s,
                    max_reconnect_attempts=-1,  # one client for the tracer's life
                    error_cb=self._on_nats_error,
                ),
                max(0.01, min(remaining, self._publish_timeout_s * 2)),
            )
        except TimeoutError:
            raise ConnectionError(f"cannot connect to NATS: {self._connect_error!r}") from None

    async def _on_nats_error(self, exc: Exception) -> None:
        self._connect_error = exc
        self._error = exc  # counted and logged with the drops; nats-py's own log line is noise

    async def _publish(self, js: Any, spans: list[Span]) -> None:
        by_agent: dict[str, list[Span]] = {}
        for s in spans:
            by_agent.setdefault(s.agent, []).append(s)
        for agent, group in by_agent.items():
            event_id = uuid.uuid5(uuid.NAMESPACE_OID, ",".join(s.span_id for s in group)).hex  # same spans, same id
            msg = SpanBatch(meta=EventMeta(event_id=event_id, source=self._source), spans=group)
            msg.meta.time.GetCurrentTime()
            await js.publish(
                self._catalogue.traces(agent),
                msg.SerializeToString(),
                timeout=self._publish_timeout_s,
                headers={"Content-Type": "application/protobuf", "Nats-Msg-Id": event_id},
            )

    # -- spans ----------------------------------------------------------------------------
    def trace(
        self, name: str = "", *, input: str = "", kind: int = SpanKind.SPAN_KIND_COORDINATION, **fields: Any
    ) -> SpanHandle:
        """A new trace: its root span (``input`` is the task). Use as ``with`` or ``async with``."""
        return SpanHandle(self, kind, name, input=input, **fields)

    def span(self, kind: int, name: str = "", **fields: Any) -> SpanHandle:
        """A child of the current span (or a new trace when there is none)."""
        return SpanHandle(self, kind, name, parent=_current.get(), **fields)

    def open_tool(self, call_id: str, handle: SpanHandle) -> None:
        self._tools[call_id] = handle

    def close_tool(self, call_id: str, result: Any, *, error: bool = False) -> bool:
        handle = self._tools.pop(call_id, None)
        if handle is None:
            return False
        handle.output = result if isinstance(result, str) else json.dumps(result, default=str)
        handle.end(error=RuntimeError("tool failed") if error else None)
        return True

    def close_pending_tools(self, trace_id: str) -> None:
        """At the end of a trace, emit tool calls whose result never came back."""
        for call_id, handle in list(self._tools.items()):
            if handle.trace_id == trace_id:
                handle.attributes["result_missing"] = True
                self._tools.pop(call_id)
                handle.end()


def configure_tracing(**kwargs: Any) -> Tracer:
    """Create the default tracer used by the module-level helpers (see :class:`Tracer`)."""
    global _default
    _default = Tracer(**kwargs)
    return _default


def _tracer(tracer: Tracer | None) -> Tracer:
    found = tracer or _default
    if found is None:
        raise RuntimeError("call flywheel.sdk.tracing.configure_tracing(...) first, or pass tracer=")
    return found


def trace(name: str = "", *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    """``with flywheel.sdk.trace("task", user_id=..., decision_id=...)``: a new trace."""
    return _tracer(tracer).trace(name, **fields)


def prompt(name: str = "llm", *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    return _tracer(tracer).span(SpanKind.SPAN_KIND_PROMPT, name, **fields)


def tool(name: str, *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    return _tracer(tracer).span(SpanKind.SPAN_KIND_TOOL, name, **fields)


def content(name: str = "content", *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    return _tracer(tracer).span(SpanKind.SPAN_KIND_CONTENT, name, **fields)


def reasoning(name: str = "reasoning", *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    return _tracer(tracer).span(SpanKind.SPAN_KIND_REASONING, name, **fields)


def coordination(name: str, *, tracer: Tracer | None = None, **fields: Any) -> SpanHandle:
    return _tracer(tracer).span(SpanKind.SPAN_KIND_COORDINATION, name, **fields)


def reward(
    value: float, *, min: float = 0.0, max: float = 1.0, name: str = "reward", tracer: Tracer | None = None
) -> None:
    """Record a reward on its own scale (the store normalises by ``[min, max]``)."""
    handle = _tracer(tracer).span(SpanKind.SPAN_KIND_REWARD, name)
    handle.span.reward, handle.span.reward_min, handle.span.reward_max = value, min, max
    handle.end()


# -- instrumenting an agent -------------------------------------------------------------------
def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def _last_user_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, list[Any]]:
    messages = kwargs.get("messages", args[0] if args else None)
    if isinstance(messages, str):
        return messages, []
    if not isinstance(messages, list):
        return "", []
    users = [m for m in messages if _get(m, "role") == "user"]
    text = _get(users[-1], "content", "") if users else ""
    return text if isinstance(text, str) else json.dumps(text, default=str), messages


class _Call:
    """What one chat call produced, assembled from chunks or a plain return value."""

    def __init__(self, tracer: Tracer, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tracer = tracer
        task, messages = _last_user_message(args, kwargs)
        for m in messages:  # tool results of the previous turn close its tool spans
            if _get(m, "role") == "tool" and _get(m, "tool_call_id"):
                tracer.close_tool(_get(m, "tool_call_id"), _get(m, "content", ""))
        self.root = None if _current.get() else tracer.trace(getattr(owner, "name", "") or "chat", input=task)
        if self.root is not None:
            self.root.__enter__()
        model = kwargs.get("model") or getattr(owner, "model", "") or ""
        self.prompt = tracer.span(SpanKind.SPAN_KIND_PROMPT, "chat", input=task, model=model)
        self.prompt.__enter__()
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.started = time.time()

    def chunk(self, chunk: Any) -> None:
        if isinstance(chunk, str):
            self.content.append(chunk)
            return
        kind = _get(chunk, "type", "content")
        if kind == "content" and _get(chunk, "content"):
            self.content.append(str(_get(chunk, "content")))
        elif kind in ("reasoning", "reasoning_delta", "thinking"):
            self.reasoning.append(str(_get(chunk, "reasoning_delta") or _get(chunk, "content") or ""))
        elif kind == "tool_calls":
            for call in _get(chunk, "tool_calls") or []:
                self._open_tool(call)
        elif kind in ("tool_result", "function_call_output"):
            self.tracer.close_tool(
                str(_get(chunk, "call_id") or _get(chunk, "tool_call_id")),
                _get(chunk, "content") or _get(chunk, "output"),
            )
        self._usage(_get(chunk, "usage"))

    def value(self, result: Any) -> None:
        """A non-streaming return: a string, an OpenAI-style message or completion, or an object."""
        if isinstance(result, str):
            self.content.append(result)
            return
        choices = _get(result, "choices")
        message = _get(choices[0], "message") if choices else result
        if _get(message, "content"):
            self.content.append(str(_get(message, "content")))
        if _get(message, "reasoning_content"):
            self.reasoning.append(str(_get(message, "reasoning_content")))
        for call in _get(message, "tool_calls") or []:
            self._open_tool(call)
        self._usage(_get(result, "usage"))

    def _open_tool(self, call: Any) -> None:
        fn = _get(call, "function") or call
        args = _get(fn, "arguments", "")
        handle = self.tracer.span(
            SpanKind.SPAN_KIND_TOOL,
            str(_get(fn, "name", "tool")),
            input=args if isinstance(args, str) else json.dumps(args, default=str),
        )
        handle.attributes["tool_call_id"] = str(_get(call, "id", ""))
        self.tracer.open_tool(str(_get(call, "id") or handle.span_id), handle)

    def _usage(self, usage: Any) -> None:
        if usage:
            self.prompt.input_tokens = int(_get(usage, "prompt_tokens", 0) or _get(usage, "input_tokens", 0) or 0)
            self.prompt.output_tokens = int(_get(usage, "completion_tokens", 0) or _get(usage, "output_tokens", 0) or 0)

    def finish(self, error: BaseException | None = None) -> None:
        text = "".join(self.content)
        for kind, parts in ((SpanKind.SPAN_KIND_REASONING, self.reasoning), (SpanKind.SPAN_KIND_CONTENT, self.content)):
            if parts:
                with self.tracer.span(kind, "reasoning" if kind == SpanKind.SPAN_KIND_REASONING else "content") as s:
                    s.output = "".join(parts)
        self.prompt.output = text
        self.prompt.__exit__(type(error) if error else None, error, None)
        if self.root is not None:
            self.root.output = text
            self.root.__exit__(type(error) if error else None, error, None)


def instrument(owner: Any, method: str = "chat", *, tracer: Tracer | None = None) -> Any:
    """Wrap ``owner.<method>`` (on the instance) so each call emits its spans; returns ``owner``."""
    tr = _tracer(tracer)
    original: Callable[..., Any] = getattr(owner, method)

    if inspect.isasyncgenfunction(original):

        @functools.wraps(original)
        async def agen(*args: Any, **kwargs: Any) -> Any:
            call = _Call(tr, owner, args, kwargs)
            try:
                async for chunk in original(*args, **kwargs):
                    call.chunk(chunk)
                    yield chunk
            except BaseException as exc:
                call.finish(exc)
                raise
            call.finish()

        wrapper: Any = agen
    elif inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def coro(*args: Any, **kwargs: Any) -> Any:
            call = _Call(tr, owner, args, kwargs)
            try:
                result = await original(*args, **kwargs)
            except BaseException as exc:
                call.finish(exc)
                raise
            call.value(result)
            call.finish()
            return result

        wrapper = coro
    elif inspect.isgeneratorfunction(original):

        @functools.wraps(original)
        def gen(*args: Any, **kwargs: Any) -> Any:
            call = _Call(tr, owner, args, kwargs)
            try:
                for chunk in original(*args, **kwargs):
                    call.chunk(chunk)
                    yield chunk
            except BaseException as exc:
                call.finish(exc)
                raise
            call.finish()

        wrapper = gen
    else:

        @functools.wraps(original)
        def plain(*args: Any, **kwargs: Any) -> Any:
            call = _Call(tr, owner, args, kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                call.finish(exc)
                raise
            call.value(result)
            call.finish()
            return result

        wrapper = plain
    setattr(owner, method, wrapper)
    return owner
