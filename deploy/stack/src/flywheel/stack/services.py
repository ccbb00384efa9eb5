"""Flywheel services as child processes: migrate, start, wait for SERVING, stop by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flywheel.stack.servers import free_ports, process_alive

SERVICES = ("optimizer", "trace_store", "evaluator", "reward_judge", "society", "trainer")
# Services that own tables, in the order their migrations run.
MIGRATED = ("optimizer", "trace_store", "reward_judge", "trainer", "society")
# The run policy of the local stack and tests (flywheel.core.run_policy): runs may call the
# evaluator's example module, nothing else; credential variables keep the default prefix
# FLYWHEEL_TARGET_. An env given to a ServiceProcess overrides it.
STACK_RUN_POLICY = {"FLYWHEEL_RUN_POLICY_CALLABLE_MODULES": "flywheel.evaluator.examples"}
# What a service's log says when a port it was given was taken between choosing and binding it
# (grpc's add_insecure_port, prometheus_client's HTTP server).
BIND_FAILURES = ("address already in use", "failed to bind")
# Times a service whose own ports were taken is started again on new ones.
BIND_RETRIES = 3


def env_prefix(service: str) -> str:
    return f"FLYWHEEL_{service.upper()}_"


def migrate(service: str, env: dict[str, str]) -> None:
    """Run ``python -m flywheel.<service> migrate``; raise with its output if it fails."""
    result = subprocess.run(
        [sys.executable, "-m", f"flywheel.{service}", "migrate"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrating {service} failed:\n{result.stdout}\n{result.stderr}")


def health_status(address: str, service: str = "", timeout_s: float = 1.0) -> str:
    """The gRPC health status name of ``service`` at ``address`` ("UNREACHABLE" if down)."""
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError:
            return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


class ServiceProcess:
    """One service process with its own gRPC and metrics ports and log file."""

    def __init__(
        self,
        name: str,
        *,
        env: dict[str, str],
        log_dir: Path,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
    ) -> None:
        if name not in SERVICES:
            raise ValueError(f"unknown service {name!r}; one of {SERVICES}")
        self.name = name
        # Ports chosen here may be taken by another process before the service binds them:
        # ``wait_serving`` then starts it again on new ones. Ports given by the caller are kept.
        self._own_ports = grpc_port is None and metrics_port is None
        given = [p for p in (grpc_port, metrics_port) if p]
        chosen = iter(free_ports(2, exclude=given))
        self.grpc_port = grpc_port or next(chosen)
        self.metrics_port = metrics_port or next(chosen)
        self.log_file = log_dir / f"{name}.log"
        self.pid_file = log_dir / f"{name}.pid"
        self.env = {**STACK_RUN_POLICY, **env, f"{env_prefix(name)}GRPC_HOST": "127.0.0.1"}
        self._set_ports()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where this start's output begins in the log

    def _set_ports(self) -> None:
        prefix = env_prefix(self.name)
        self.env[f"{prefix}GRPC_PORT"] = str(self.grpc_port)
        self.env[f"{prefix}METRICS_PORT"] = str(self.metrics_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        try:
            return int(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", f"flywheel.{self.name}"],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid_file.write_text(str(self._proc.pid))

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        """Wait until the service reports SERVING; raise with its log if it exits or times out.
        A service that exits because one of the ports chosen for it was taken meanwhile is
        started again on new ports (``BIND_RETRIES`` times)."""
        deadline = time.monotonic() + timeout_s
        retries = BIND_RETRIES
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                if self._own_ports and retries > 0 and self._bind_failed():
                    retries -= 1
                    self.grpc_port, self.metrics_port = free_ports(2, exclude=(self.grpc_port, self.metrics_port))
                    self._set_ports()
                    self.start()
                    continue
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}:\n{self.log_tail()}")
            if health_status(self.address) == "SERVING":
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not SERVING after {timeout_s}s:\n{self.log_tail()}")

    def _bind_failed(self) -> bool:
        """Whether this start's output says a port was already in use."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace").lower()
        except FileNotFoundError:
            return False
        return any(marker in text for marker in BIND_FAILURES)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM and wait; SIGKILL after the timeout. Returns the exit code if known."""
        pid = self.pid
        if pid is None:
            return None
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            self.pid_file.unlink(missing_ok=True)
            return None
        code = self._wait(pid, timeout_s)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            code = self._wait(pid, 5.0)
        self.pid_file.unlink(missing_ok=True)
        return code

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self._wait(self.pid, 5.0)

    def _wait(self, pid: int, timeout_s: float) -> int | None:
        if self._proc is not None:
            try:
                return self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return None
        # Not our child (``down`` from another process): poll, counting zombies as gone.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not process_alive(pid):
                return 0
            time.sleep(0.05)
        return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"
