"""Prometheus metrics shared by every service, and the /metrics HTTP server."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RPC_TOTAL = Counter("flywheel_grpc_requests_total", "gRPC requests handled", ["method", "code"])
RPC_SECONDS = Histogram(
    "flywheel_grpc_request_seconds",
    "gRPC request latency",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
EVENTS_TOTAL = Counter(
    "flywheel_events_total", "Events consumed, by outcome (ack, deadletter, retry)", ["consumer", "outcome"]
)
EVENT_SECONDS = Histogram("flywheel_event_seconds", "Event handling latency", ["consumer"])
# A consumer's lag, as its replicas see it at each fetch: how old an event is when it is taken
# (JetStream's stored timestamp to now), and how many of the stream's messages wait behind it.
EVENT_AGE = Histogram(
    "flywheel_event_age_seconds",
    "Age of an event when its consumer takes it (stored in the stream to handled)",
    ["consumer"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
# The same lag cut into stages, per event, finely enough for milliseconds (bench/service-regret/lag.py):
# "busy" stored -> the fetch that took it was sent (the consumer was not fetching: handling earlier
# batches, or holding as many as it may), "fetch" the later of stored and that request -> fetched,
# "queue" fetched -> its batch's handling began, "handle" -> the handler returned (for
# optimizer-feedback: applied, committed and folded), "ack" -> acked, and "total" stored -> acked.
EVENT_LAG = Histogram(
    "flywheel_event_lag_seconds",
    "Stages of an event's way from the stream to settled (busy, fetch, queue, handle, ack, total)",
    ["consumer", "stage"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 10, 60),
)
PENDING = Gauge("flywheel_consumer_pending", "Messages waiting for the consumer after its last fetch", ["consumer"])
READY = Gauge("flywheel_dependency_ready", "1 when the dependency answered its last check", ["dependency"])


def serve_metrics(
    host: str,
    port: int,
    *,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    client_cafile: Path | None = None,
) -> None:
    """Expose /metrics on host:port in a daemon thread (port 0 disables); over HTTPS with
    ``certfile`` and ``keyfile``, requiring a client certificate signed by ``client_cafile``."""
    if not port:
        return
    if certfile is None:
        start_http_server(port, addr=host)
        return
    start_http_server(
        port,
        addr=host,
        certfile=str(certfile),
        keyfile=str(keyfile) if keyfile else None,
        client_cafile=str(client_cafile) if client_cafile else None,
        client_auth_required=client_cafile is not None,
    )
