"""Readiness over gRPC health: each service is SERVING while the servers it depends on
answer, NOT_SERVING while one of them is down, and SERVING again once it is back."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.stack.services import MIGRATED, SERVICES, ServiceProcess, env_prefix, health_status
from flywheel.stack.stack import Servers
from flywheel.stack.testing import migrate_in_process as migrate
from flywheel.stack.testing import server_root

pytestmark = pytest.mark.integration

DEPENDS_ON = {
    "optimizer": {"nats", "postgres", "s3"},
    "trace_store": {"nats", "postgres", "s3"},
    "evaluator": {"nats"},
    "reward_judge": {"postgres", "s3"},
    "society": {"nats", "postgres", "s3"},
    "trainer": {"nats", "postgres", "s3"},
}


@pytest.fixture(scope="module")
def private_stack() -> Iterator[tuple[Servers, dict[str, ServiceProcess]]]:
    """Servers of this module's own (the test stops them) and all six services on them."""
    root: Path = server_root("health")
    servers = Servers.create(root)
    servers.start()
    env = servers.env()
    for name in MIGRATED:
        migrate(name, env)
    procs = {}
    try:
        for name in SERVICES:
            proc = ServiceProcess(
                name, env={**env, f"{env_prefix(name)}READINESS_INTERVAL_S": "0.3"}, log_dir=root / "services"
            )
            proc.start()
            procs[name] = proc
        for proc in procs.values():
            proc.wait_serving()
        yield servers, procs
    finally:
        for proc in procs.values():
            proc.stop()
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


def statuses(procs: dict[str, ServiceProcess]) -> dict[str, str]:
    return {name: health_status(proc.address) for name, proc in procs.items()}


def wait_for_statuses(procs: dict[str, ServiceProcess], expected: dict[str, str], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = statuses(procs)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = statuses(procs)
    assert seen == expected


@pytest.mark.parametrize("dependency", ["nats", "postgres", "s3"])
def test_not_serving_while_a_dependency_is_down(private_stack, dependency):
    servers, procs = private_stack
    server = {"nats": servers.nats, "postgres": servers.postgres, "s3": servers.s3}[dependency]
    assert server is not None
    wait_for_statuses(procs, dict.fromkeys(procs, "SERVING"))

    server.kill()
    try:
        wait_for_statuses(procs, {n: "NOT_SERVING" if dependency in DEPENDS_ON[n] else "SERVING" for n in procs})
    finally:
        server.start()
    wait_for_statuses(procs, dict.fromkeys(procs, "SERVING"), timeout_s=30.0)
    # Per-service health names follow the server-wide status.
    assert health_status(procs["optimizer"].address, "flywheel.api.optimizer.v1.SelectionService") == "SERVING"


def test_a_service_whose_chosen_port_was_taken_meanwhile_starts_on_new_ones(private_stack, tmp_path):
    """Ports are chosen free, then bound by the service a moment later: if another process
    takes one in between, the service is started again on new ports, not failed."""
    import socket

    servers, _ = private_stack
    proc = ServiceProcess("evaluator", env=servers.env(), log_dir=tmp_path)
    taken = proc.grpc_port
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        proc.start()
        proc.wait_serving()
        assert proc.grpc_port != taken and health_status(proc.address) == "SERVING"
        assert "already in use" in proc.log_file.read_text().lower() or "failed to bind" in (
            proc.log_file.read_text().lower()
        )
    finally:
        proc.stop()
        squatter.close()
