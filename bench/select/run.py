"""Saturated Select throughput of the real optimizer vs gRPC peers, load from h2load.

Each server runs alone on core 1 (``taskset -c 1``); h2load (C, nghttp2) drives it from
core 0, where NATS, PostgreSQL and S3 also live. Targets:

- ``flywheel``: the real optimizer process (``python -m flywheel.optimizer``) against real
  NATS/PostgreSQL/S3 from flywheel.stack, an endpoint of three arms created through the
  admin API and fitted with 300 Select + Update round trips. Every decision it makes is
  buffered and written to PostgreSQL and JetStream by the same process.
- ``grpc_echo_aio`` / ``grpc_echo_sync``: bare grpcio servers (grpc.aio, and the sync
  server with a thread pool) returning one fixed SelectResponse.
- ``mabwiser``: MABWiser ThompsonSampling ``predict`` in a grpc.aio server.
- ``convergence``: The Convergence's ``runtime_select`` (in-memory storage) on the gRPC server
  kind fastest for it (``peers.CONVERGENCE_SERVER``); ``convergence_<other kind>`` on the other.

The peers are in bench/select/peers.py; the method and its choices in bench/select/README.md.

    python bench/select/run.py [--quick]

Needs h2load (Debian ``nghttp2-client``; installed with apt-get if missing) and the peers'
packages from bench/select/requirements.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc
from flywheel.optimizer.settings import OptimizerSettings
from flywheel.stack import benchstamp
from flywheel.stack.servers import free_port
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "bench" / "results" / "select.json"
sys.path.insert(0, str(HERE))
import peers  # noqa: E402  (bench/select/peers.py: the arms and the peer servers)

SERVER_CPU = 1
LOADGEN_CPU = 0
SERVICE = "flywheel.api.optimizer.v1.SelectionService"
ENDPOINT = "bench"
# The same three arms with segment_key="lang": the request's context (lang=en) names its segment,
# so Select goes through the segment cache (segment_cache.py) instead of the endpoint's snapshot.
SEGMENTED_ENDPOINT = "bench_segmented"
SEGMENT_KEY = "lang"
# Segmented Select's latency against the unsegmented one's, at the same offered rate (issue 19).
SEGMENTED_P50_GOAL = 1.5
USER_ID = "u-1"
CONTEXT = {"lang": "en"}
BATCH = 100
AUTH_TOKEN = "bench-select-token"  # noqa: S105 - a throwaway token for a loopback-only server
FIT_SELECTS = 300

GOALS = {"flywheel_vs_grpc_echo": 0.85, "flywheel_vs_mabwiser": 1.1, "flywheel_vs_convergence": 2.0}
# The Convergence on the server kind fastest for it (the headline) and on the other one.
CONVERGENCE_OTHER = "sync" if peers.CONVERGENCE_SERVER == "aio" else "aio"
TARGETS = (
    "flywheel",
    "flywheel_segmented",
    "grpc_echo_aio",
    "grpc_echo_sync",
    "mabwiser",
    "convergence",
    f"convergence_{CONVERGENCE_OTHER}",
)
# The optimizer's gRPC server: its default (grpcio's thread-pool server) unless
# FLYWHEEL_OPTIMIZER_GRPC_SERVER says otherwise; the goal's echo and MABWiser's server follow it.
FLAVOUR = os.environ.get("FLYWHEEL_OPTIMIZER_GRPC_SERVER", OptimizerSettings.model_fields["grpc_server"].default)
OTHER_FLAVOUR = "sync" if FLAVOUR == "aio" else "aio"
RATIO_PEERS = {
    "flywheel_vs_grpc_echo": f"grpc_echo_{FLAVOUR}",
    f"flywheel_vs_grpc_echo_{OTHER_FLAVOUR}": f"grpc_echo_{OTHER_FLAVOUR}",
    "flywheel_vs_mabwiser": "mabwiser",
    "flywheel_vs_convergence": "convergence",
    f"flywheel_vs_convergence_{CONVERGENCE_OTHER}": f"convergence_{CONVERGENCE_OTHER}",
}


@dataclass(frozen=True)
class Params:
    quick: bool
    rounds: int
    warmup_s: float
    saturate_s: float
    latency_s: float
    batch_s: float
    clients: int = 4
    streams: int = 16  # per client: 64 requests in flight at saturation
    latency_clients: int = 4
    batch_clients: int = 2
    batch_streams: int = 4
    latency_skip_s: float = 1.0  # requests started in the first second of a latency run are dropped


def params_for(quick: bool) -> Params:
    if quick:
        return Params(quick=True, rounds=1, warmup_s=1, saturate_s=3, latency_s=3, batch_s=2)
    return Params(quick=False, rounds=2, warmup_s=2, saturate_s=8, latency_s=7, batch_s=5)


# --- processes ------------------------------------------------------------------------------


@contextlib.contextmanager
def affinity(cpus: set[int]) -> Iterator[None]:
    """Run the block with this thread pinned to ``cpus``: children it spawns inherit it."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process and of its descendants (like ``taskset -a -p``)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            for thread in proc.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(thread.id, cpus)


def stop_pid(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return proc.wait(5)


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# --- h2load ---------------------------------------------------------------------------------


def ensure_h2load() -> str:
    found = shutil.which("h2load")
    if found:
        return found
    print("h2load not found: installing the Debian package nghttp2-client (apt-get install -y)", file=sys.stderr)
    cmd = ["apt-get", "install", "-y", "nghttp2-client"]
    if subprocess.run(cmd, check=False, stdout=sys.stderr, stderr=sys.stderr).returncode != 0:
        subprocess.run(["apt-get", "update"], check=True, stdout=sys.stderr, stderr=sys.stderr)
        subprocess.run(cmd, check=True, stdout=sys.stderr, stderr=sys.stderr)
    found = shutil.which("h2load")
    if not found:
        raise SystemExit("h2load is still missing after installing nghttp2-client")
    return found


def grpc_frame(message: Any) -> bytes:
    """One uncompressed gRPC message: flag 0, 4-byte big-endian length, the bytes."""
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def select_request(endpoint: str = ENDPOINT) -> sel_pb.SelectRequest:
    request = sel_pb.SelectRequest(endpoint=endpoint, user_id=USER_ID)
    request.context.update(CONTEXT)
    return request


_H2_NUM = r"([\d.]+)"


@dataclass
class H2Result:
    seconds: float
    rps: float
    total: int
    succeeded: int
    failed: int
    errored: int
    status_2xx: int
    mean_ms: float
    loadgen_cpu_s: float
    latencies_us: np.ndarray | None = None

    @property
    def loadgen_cpu_util(self) -> float:
        return self.loadgen_cpu_s / self.seconds if self.seconds else 0.0


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


class H2load:
    def __init__(self, binary: str, work: Path) -> None:
        self.binary = binary
        self.work = work
        self.select_body = work / "select.bin"
        self.select_body.write_bytes(grpc_frame(select_request()))
        self.batch_body = work / "select_batch.bin"
        self.batch_body.write_bytes(grpc_frame(sel_pb.SelectBatchRequest(requests=[select_request()] * BATCH)))
        # The segmented endpoint's requests (the flywheel_segmented target).
        self.segmented_bodies = {"Select": work / "select_segmented.bin", "SelectBatch": work / "batch_segmented.bin"}
        self.segmented_bodies["Select"].write_bytes(grpc_frame(select_request(SEGMENTED_ENDPOINT)))
        self.segmented_bodies["SelectBatch"].write_bytes(
            grpc_frame(sel_pb.SelectBatchRequest(requests=[select_request(SEGMENTED_ENDPOINT)] * BATCH))
        )

    def run(
        self,
        port: int,
        *,
        method: str = "Select",
        seconds: float,
        clients: int,
        streams: int,
        rps_per_client: float | None = None,
        headers: dict[str, str] | None = None,
        log_latency: bool = False,
        body: Path | None = None,
        endpoint: str = ENDPOINT,
    ) -> H2Result:
        if body is None and endpoint == SEGMENTED_ENDPOINT:
            body = self.segmented_bodies[method]
        body = body or (self.select_body if method == "Select" else self.batch_body)
        log_file = self.work / "h2load-requests.tsv"
        cmd = ["taskset", "-c", str(LOADGEN_CPU), self.binary, "-t", "1", "-c", str(clients), "-m", str(streams)]
        cmd += ["-D", f"{seconds:g}", "-d", str(body)]
        cmd += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        for key, value in (headers or {}).items():
            cmd += ["-H", f"{key}: {value}"]
        if rps_per_client:
            cmd += ["--rps", f"{rps_per_client:g}"]
        if log_latency:
            log_file.unlink(missing_ok=True)
            cmd += ["--log-file", str(log_file)]
        cmd.append(f"http://127.0.0.1:{port}/{SERVICE}/{method}")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=seconds + 60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            raise RuntimeError(f"h2load failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        text = out.stdout
        fin = re.search(rf"finished in {_H2_NUM}s, {_H2_NUM} req/s", text)
        req = re.search(
            r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text
        )
        codes = re.search(r"status codes: (\d+) 2xx", text)
        tfr = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
        if not (fin and req and codes and tfr):
            raise RuntimeError(f"cannot parse h2load output:\n{text[-3000:]}")
        result = H2Result(
            seconds=float(fin.group(1)),
            rps=float(fin.group(2)),
            total=int(req.group(1)),
            succeeded=int(req.group(4)),
            failed=int(req.group(5)),
            errored=int(req.group(6)),
            status_2xx=int(codes.group(1)),
            mean_ms=_ms(tfr.group(3)),
            loadgen_cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        )
        if log_latency:
            # Each line: start time (us since the epoch), HTTP status, duration (us).
            rows = np.loadtxt(log_file, dtype=np.int64, ndmin=2)
            if rows.size:
                start = rows[:, 0] - rows[:, 0].min()
                ok = (rows[:, 1] == 200) & (start >= self._skip_us)
                result.latencies_us = rows[ok, 2]
        return result

    _skip_us = 1_000_000


# --- targets --------------------------------------------------------------------------------


class Target:
    """A server on core 1 that answers Select and SelectBatch."""

    name: str
    headers: dict[str, str] = {}
    endpoint = ENDPOINT  # the endpoint its requests name

    def __init__(self, work: Path) -> None:
        self.work = work
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        """Calls answered OK so far (select, select_batch) and calls that failed (errors)."""
        raise NotImplementedError

    def extra_figures(self) -> dict[str, Any]:
        return {}

    def metadata(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.headers.items()]


class PeerTarget(Target):
    def __init__(self, work: Path, name: str, kind: str, flavour: str, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(work)
        self.name, self.kind, self.flavour = name, kind, flavour
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = work / f"{name}.log"
        self._final: dict[str, int] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.port = free_port()
        cmd = ["taskset", "-c", str(SERVER_CPU), sys.executable, str(HERE / "peers.py")]
        cmd += ["--kind", self.kind, "--flavour", self.flavour, "--port", str(self.port), "--user-id", USER_ID]
        cmd += self.extra_args
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        ready = json.dumps({"serving": self.port})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if ready in self.log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not serving after 120 s:\n{self.log.read_text()[-3000:]}")

    def counts(self) -> dict[str, int]:
        with grpc.insecure_channel(self.address) as channel:
            raw = channel.unary_unary(peers.STATS_METHOD)(b"", timeout=5)
        got = json.loads(raw)
        return {"select": got["select"], "select_batch": got["select_batch"], "errors": got["errors"]}

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)
            self.proc = None


class FlywheelTarget(Target):
    name = "flywheel"
    headers = {"authorization": f"Bearer {AUTH_TOKEN}"}

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        super().__init__(work)
        self.env = {**env, "FLYWHEEL_OPTIMIZER_AUTH_TOKEN": AUTH_TOKEN}
        self.proc: ServiceProcess | None = None
        self.fitted = False

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.pid is not None
        return self.proc.pid

    def start(self) -> None:
        self.proc = ServiceProcess("optimizer", env=self.env, log_dir=self.work / "services")
        self.port = self.proc.grpc_port
        with affinity({SERVER_CPU}):  # the process and every thread it starts inherit core 1
            self.proc.start()
        self.proc.wait_serving(60)
        pin_tree(self.pid, {SERVER_CPU})
        if not self.fitted:
            self._create_and_fit()
            self.fitted = True

    def _create_and_fit(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            md = self.metadata()
            admin = admin_grpc.EndpointAdminServiceStub(channel)
            arms = []
            for arm_id, params in peers.ARMS.items():
                arm = ep_pb.Arm(arm_id=arm_id)
                arm.params.update(params)
                arms.append(arm)
            admin.CreateEndpoint(
                admin_pb.CreateEndpointRequest(
                    endpoint=ep_pb.Endpoint(name=self.endpoint, arms=arms, policy=self.policy())
                ),
                metadata=md,
            )
            stub = sel_grpc.SelectionServiceStub(channel)
            rng = np.random.default_rng(3)
            chosen = [stub.Select(select_request(self.endpoint), metadata=md) for _ in range(FIT_SELECTS)]
            for d in chosen:
                reward = float(rng.random() < peers.RATES[d.arm_id])
                stub.Update(sel_pb.UpdateRequest(decision_id=d.decision_id, reward=reward), metadata=md, timeout=10)
        time.sleep(1.0)  # one posterior refresh (0.5 s) so the snapshot reflects the feedback

    def policy(self) -> ep_pb.PolicySpec:
        return ep_pb.PolicySpec()

    def counts(self) -> dict[str, int]:
        assert self.proc is not None
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.proc.metrics_port}/metrics", timeout=5).read().decode()
        out = {"select": 0, "select_batch": 0, "errors": 0, "shed": 0}
        for labels, value in re.findall(r"^flywheel_grpc_requests_total\{([^}]*)\} (\S+)$", text, re.M):
            got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            method, code = got.get("method", ""), got.get("code", "")
            if not method.startswith(f"/{SERVICE}/"):
                continue
            short = method.rsplit("/", 1)[1]
            if code == "RESOURCE_EXHAUSTED":  # the decision log's bound: load shed, counted apart
                out["shed"] += int(float(value))
            elif code != "OK":
                out["errors"] += int(float(value))
            elif short == "Select":
                out["select"] += int(float(value))
            elif short == "SelectBatch":
                out["select_batch"] += int(float(value))
            elif short == "Update":
                out["update"] = out.get("update", 0) + int(float(value))
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.log_path = self.proc.log_file
            self.proc = None

    def extra_figures(self) -> dict[str, Any]:
        """Decision-log health from this process's log: flushes that failed, and the first error."""
        failures, first = 0, ""
        path = getattr(self, "log_path", None)
        text = path.read_text(errors="replace") if path and path.exists() else ""
        for line in text.splitlines()[self._log_lines_seen :]:
            if "decision flush failed" in line or ("close failed" in line and "decision" in line.lower()):
                failures += 1
                with contextlib.suppress(ValueError):
                    first = first or json.loads(line).get("error", line)[:300]
        self._log_lines_seen = len(text.splitlines())
        return {"decision_flush_failures": failures, "decision_flush_first_error": first}

    _log_lines_seen = 0


class FlywheelSegmentedTarget(FlywheelTarget):
    """The same optimizer (a process of its own on the same stack) serving an endpoint with a
    ``segment_key``: every request is in segment ``lang=en``, whose snapshot the segment cache
    holds after the first Select (one segment or many cost the same lookup per Select)."""

    name = "flywheel_segmented"
    endpoint = SEGMENTED_ENDPOINT

    def policy(self) -> ep_pb.PolicySpec:
        return ep_pb.PolicySpec(segment_key=SEGMENT_KEY)


def check_responses(target: Target) -> None:
    """A Python client's Select and SelectBatch: gRPC OK, a known arm, a decision id."""
    with grpc.insecure_channel(target.address) as channel:
        stub = sel_grpc.SelectionServiceStub(channel)
        md = target.metadata()
        one = stub.Select(select_request(target.endpoint), metadata=md, timeout=10)
        batch = stub.SelectBatch(
            sel_pb.SelectBatchRequest(requests=[select_request(target.endpoint)] * BATCH), metadata=md, timeout=30
        )
    for d in [one, *batch.decisions]:
        if d.arm_id not in peers.ARMS or not d.decision_id or dict(d.params) == {}:
            raise RuntimeError(f"{target.name}: bad response {d}")
    if len(batch.decisions) != BATCH:
        raise RuntimeError(f"{target.name}: SelectBatch answered {len(batch.decisions)} decisions, not {BATCH}")


# --- measuring ------------------------------------------------------------------------------


@dataclass
class Phase:
    h2: H2Result
    server_ok: int
    server_errors: int
    server_cpu_util: float
    seconds: float = 0.0
    server_shed: int = 0

    def check(self, what: str, in_flight: int, *, allow_shed: bool = False) -> dict[str, Any]:
        """h2load counts HTTP 2xx; the server counts gRPC OK. Every 2xx must be an OK, and the
        server may have finished up to ``in_flight`` more (answered after h2load stopped). With
        ``allow_shed``, a 2xx may also be a RESOURCE_EXHAUSTED (load shed by the decision log's
        bound), counted apart; any other error fails the check."""
        answered = self.server_ok + (self.server_shed if allow_shed else 0)
        ok = self.h2.status_2xx <= answered <= self.h2.status_2xx + in_flight and self.server_errors == 0
        if not ok or (self.server_shed and not allow_shed):
            raise RuntimeError(
                f"{what}: h2load saw {self.h2.status_2xx} 2xx, the server {self.server_ok} OK, "
                f"{self.server_shed} RESOURCE_EXHAUSTED and {self.server_errors} other errors "
                f"(at most {in_flight} may have been in flight)"
            )
        return {
            "h2load_2xx": self.h2.status_2xx,
            "server_grpc_ok": self.server_ok,
            "server_grpc_shed": self.server_shed,
            "server_grpc_errors": 0,
        }


def measure(target: Target, key: str, run: Callable[[], H2Result]) -> Phase:
    before, cpu0, t0 = target.counts(), cpu_seconds(target.pid), time.monotonic()
    h2 = run()
    cpu1, t1 = cpu_seconds(target.pid), time.monotonic()
    time.sleep(0.2)  # let the last answers be counted
    after = target.counts()
    return Phase(
        h2=h2,
        server_ok=after[key] - before[key],
        server_errors=after["errors"] - before["errors"],
        server_cpu_util=(cpu1 - cpu0) / (t1 - t0),
        seconds=t1 - t0,
        server_shed=after.get("shed", 0) - before.get("shed", 0),
    )


def new_work(prefix: str) -> tuple[Path, Servers]:
    """A scratch folder for one bench run, and the servers of a stack to be started in it."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    work.chmod(0o755)  # PostgreSQL's unprivileged system user must reach its data folder
    return work, Servers.create(work / "stack")


def start_stack(servers: Servers, namespace: str, schema: str) -> dict[str, str]:
    """Start NATS, PostgreSQL and S3 pinned to the load generator's core, migrate the
    optimizer's schema, and return the optimizer's environment (quiet logs)."""
    with affinity({LOADGEN_CPU}):
        servers.start()
    for server in servers.all():
        if server.pid:
            pin_tree(server.pid, {LOADGEN_CPU})
    env = servers.env(namespace=namespace, schema=schema, bucket_prefix=namespace)
    env["FLYWHEEL_OPTIMIZER_LOG_LEVEL"] = "WARNING"
    migrate("optimizer", env)
    return env


def settled_counts(target: Target, timeout_s: float = 10.0) -> dict[str, int]:
    """The server's counts once they stop moving: a thread-pool server finishes the calls it had
    queued after h2load has gone (an asyncio server cancels them), and each still logs its
    decisions, so counting any earlier would make the log look bigger than the decisions made."""
    last, deadline = target.counts(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = target.counts()
        if now == last:
            return now
        last = now
    return last


def percentiles(lat_us: np.ndarray) -> dict[str, float]:
    if lat_us is None or lat_us.size == 0:
        return {}
    ms = lat_us / 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "samples": int(ms.size),
    }


def run_target(target: Target, h2: H2load, p: Params, latency_rate: float | None) -> dict[str, Any]:
    """Start, check, warm up, measure saturated Select, Select at ``latency_rate``, SelectBatch; stop."""
    started = time.monotonic()
    target.start()
    try:
        pin_tree(target.pid, {SERVER_CPU})
        check_responses(target)
        md = dict(target.headers)
        sat = dict(seconds=p.saturate_s, clients=p.clients, streams=p.streams, headers=md, endpoint=target.endpoint)
        h2.run(target.port, **{**sat, "seconds": p.warmup_s})
        phase = measure(target, "select", lambda: h2.run(target.port, **sat))
        out: dict[str, Any] = {
            "select_rps": phase.h2.rps,
            "select_mean_ms_saturated": phase.h2.mean_ms,
            "server_cpu_util": phase.server_cpu_util,
            "loadgen_cpu_util": phase.h2.loadgen_cpu_util,
            "select_check": phase.check(f"{target.name} Select", p.clients * p.streams),
        }
        rate = latency_rate or phase.h2.rps / 2
        per_client = max(1, round(rate / p.latency_clients))
        lat = measure(
            target,
            "select",
            lambda: h2.run(
                target.port,
                seconds=p.latency_s + p.latency_skip_s,
                clients=p.latency_clients,
                streams=p.streams,
                rps_per_client=per_client,
                headers=md,
                log_latency=True,
                endpoint=target.endpoint,
            ),
        )
        out["latency"] = {
            "offered_rps": per_client * p.latency_clients,
            "achieved_rps": lat.h2.rps,
            "server_cpu_util": lat.server_cpu_util,
            **percentiles(lat.h2.latencies_us),
            "check": lat.check(f"{target.name} latency", p.latency_clients * p.streams),
        }
        batch = measure(
            target,
            "select_batch",
            lambda: h2.run(
                target.port,
                method="SelectBatch",
                seconds=p.batch_s,
                clients=p.batch_clients,
                streams=p.batch_streams,
                headers=md,
                endpoint=target.endpoint,
            ),
        )
        # Only answered batches count: past the decision log's bound the server sheds calls
        # (RESOURCE_EXHAUSTED), which h2load counts as 2xx like any gRPC answer.
        answered = batch.server_ok + batch.server_shed
        out["batch"] = {
            "calls_per_s": batch.h2.rps * batch.server_ok / answered if answered else 0.0,
            "decisions_per_s": batch.h2.rps * BATCH * batch.server_ok / answered if answered else 0.0,
            "h2load_calls_per_s": batch.h2.rps,
            "shed_fraction": batch.server_shed / answered if answered else 0.0,
            "mean_ms": batch.h2.mean_ms,
            "server_cpu_util": batch.server_cpu_util,
            "check": batch.check(f"{target.name} SelectBatch", p.batch_clients * p.batch_streams, allow_shed=True),
        }
        final = settled_counts(target)
        out["decisions_made"] = final["select"] + final["select_batch"] * BATCH  # since the process started
        out["cpu_us_per_select"] = 1e6 * phase.server_cpu_util / phase.h2.rps
    finally:
        target.stop()
    out.update(target.extra_figures())
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


# --- the run --------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine (``benchstamp.machine``) plus h2load's version; keys kept from before the stamp."""
    found = benchstamp.machine(("grpcio", "protobuf", "numpy", "mabwiser", "the-convergence"))
    h2v = subprocess.run(["h2load", "--version"], check=False, capture_output=True, text=True).stdout.strip()
    return {**found, "h2load": h2v, "load_average_at_start": found["load_at_start"], **found["packages"]}


def decisions_logged(servers: Servers, schema: str) -> int:
    import asyncpg

    pg = servers.postgres
    assert pg is not None

    async def count() -> int:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=pg.port, user=pg.user, password=pg.password, database=pg.database
        )
        try:
            return int(await conn.fetchval(f'SELECT count(*) FROM "{schema}".decisions'))  # noqa: S608 - our schema
        finally:
            await conn.close()

    return asyncio.run(count())


def summarize(rounds: list[dict[str, dict[str, Any]]], targets: list[str]) -> dict[str, Any]:
    """Best of the rounds for throughput (other tenants only ever take CPU away); the latency
    and batch figures of the round with the best Select throughput are reported beside it."""
    figures: dict[str, Any] = {}
    for name in targets:
        runs = [r[name] for r in rounds if name in r]
        best = max(runs, key=lambda r: r["select_rps"])
        figures[name] = {
            "select_rps": best["select_rps"],
            "select_rps_rounds": [r["select_rps"] for r in runs],
            "select_batch_decisions_per_s": max(r["batch"]["decisions_per_s"] for r in runs),
            "select_batch_decisions_per_s_rounds": [r["batch"]["decisions_per_s"] for r in runs],
            "select_batch_shed_fraction": max(r["batch"].get("shed_fraction", 0.0) for r in runs),
            "latency_at_common_rate": min((r["latency"] for r in runs), key=lambda x: x.get("p99_ms", 1e9)),
            "server_cpu_util": best["server_cpu_util"],
            "loadgen_cpu_util": best["loadgen_cpu_util"],
            # The server's CPU time per Select (median of rounds): robust to other tenants.
            "cpu_us_per_select": statistics.median(r["cpu_us_per_select"] for r in runs),
            "rounds": runs,
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of short runs (about a minute)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated subset of {TARGETS}")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after the run")
    args = parser.parse_args(argv)
    p = params_for(args.quick)
    targets = [t for t in args.targets.split(",") if t]
    if "flywheel" not in targets or any(t not in TARGETS for t in targets):
        parser.error(f"--targets must include flywheel and be among {TARGETS}")
    if os.cpu_count() is None or max(SERVER_CPU, LOADGEN_CPU) >= len(os.sched_getaffinity(0)):
        raise SystemExit("bench/select needs at least 2 CPUs (server on core 1, load on core 0)")
    started = time.monotonic()
    h2load_bin = ensure_h2load()
    work, servers = new_work("flywheel-bench-select-")
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        print(f"starting NATS, PostgreSQL and S3 on core {LOADGEN_CPU} ...", file=sys.stderr)
        schema = "bench_select"
        env = start_stack(servers, "bsel", schema)
        h2 = H2load(h2load_bin, work)
        flywheel = FlywheelTarget(work, env)
        segmented = FlywheelSegmentedTarget(work, env)
        make: dict[str, Callable[[], Target]] = {
            "flywheel": lambda: flywheel,
            "flywheel_segmented": lambda: segmented,
            "grpc_echo_aio": lambda: PeerTarget(work, "grpc_echo_aio", "echo", "aio"),
            "grpc_echo_sync": lambda: PeerTarget(work, "grpc_echo_sync", "echo", "sync"),
            "mabwiser": lambda: PeerTarget(work, "mabwiser", "mabwiser", FLAVOUR),
            "convergence": lambda: PeerTarget(work, "convergence", "convergence", peers.CONVERGENCE_SERVER),
            f"convergence_{CONVERGENCE_OTHER}": lambda: PeerTarget(
                work, f"convergence_{CONVERGENCE_OTHER}", "convergence", CONVERGENCE_OTHER
            ),
        }
        latency_rate: float | None = None
        for i in range(p.rounds):
            order = targets if i % 2 == 0 else [targets[0], *reversed(targets[1:])]
            this: dict[str, dict[str, Any]] = {}
            for name in order:
                print(f"round {i + 1}/{p.rounds}: {name} ...", file=sys.stderr)
                this[name] = run_target(make[name](), h2, p, latency_rate)
                if name == "flywheel" and latency_rate is None:
                    latency_rate = this[name]["select_rps"] / 2  # every target is measured at this rate
                print(
                    f"  {this[name]['select_rps']:8.0f} Select/s  cpu {this[name]['server_cpu_util']:.2f}  "
                    f"p99 {this[name]['latency'].get('p99_ms', float('nan')):.1f} ms  "
                    f"batch {this[name]['batch']['decisions_per_s']:8.0f} decisions/s",
                    file=sys.stderr,
                )
            rounds.append(this)
        time.sleep(0.5)
        logged = decisions_logged(servers, schema)
    finally:
        for stop in (lambda: servers.stop(),):
            with contextlib.suppress(Exception):
                stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work folder kept: {work}", file=sys.stderr)

    figures: dict[str, Any] = summarize(rounds, targets)
    # Both optimizer targets write to the same decisions table.
    ours = [r[t] for r in rounds for t in ("flywheel", "flywheel_segmented") if t in r]
    made = sum(x["decisions_made"] for x in ours)
    failures = sum(x.get("decision_flush_failures", 0) for x in ours)
    figures["flywheel_decision_log"] = {
        "decisions_made": made,
        "rows_in_postgresql": logged,
        "flush_failures_logged": failures,
        "first_flush_error": next(
            (e for x in ours if (e := x.get("decision_flush_first_error"))),
            "",
        ),
        "complete": logged == made and failures == 0,
    }
    figures["latency_common_rate_rps"] = latency_rate
    figures["flywheel_grpc_server"] = FLAVOUR
    ratios: dict[str, float] = {}
    fly = figures["flywheel"]
    for ratio, peer in RATIO_PEERS.items():
        if peer in figures:
            ratios[ratio] = fly["select_rps"] / figures[peer]["select_rps"]
    for peer in [t for t in targets[1:] if t != "flywheel_segmented"]:
        ratios[f"flywheel_vs_{peer}_batch_decisions"] = (
            fly["select_batch_decisions_per_s"] / figures[peer]["select_batch_decisions_per_s"]
        )
    figures["ratios_per_round"] = [
        {ratio: r["flywheel"]["select_rps"] / r[peer]["select_rps"] for ratio, peer in RATIO_PEERS.items() if peer in r}
        for r in rounds
    ]
    # Inverse ratio of CPU microseconds per Select: the throughput ratio each would have with a full core.
    figures["ratios_cpu_normalized"] = {
        ratio: figures[peer]["cpu_us_per_select"] / fly["cpu_us_per_select"]
        for ratio, peer in RATIO_PEERS.items()
        if peer in figures
    }
    figures["goals_met"] = {k: bool(ratios.get(k, 0) >= v) for k, v in GOALS.items() if k in ratios}
    if "flywheel_segmented" in figures:
        figures["segmented_vs_unsegmented"] = segmented_comparison(figures)
    figures["seconds"] = round(time.monotonic() - started, 1)
    result = {
        "name": "select",
        "machine": machine(),
        "params": {
            **p.__dict__,
            "server_cpu": SERVER_CPU,
            "loadgen_cpu": LOADGEN_CPU,
            "infrastructure_cpu": LOADGEN_CPU,
            "batch_size": BATCH,
            "request": {"endpoint": ENDPOINT, "user_id": USER_ID, "context": CONTEXT},
            "segmented_endpoint": {"name": SEGMENTED_ENDPOINT, "segment_key": SEGMENT_KEY},
            "arms": peers.ARMS,
            "flywheel_auth": "bearer token (checked on every call)",
            "flywheel_grpc_server": FLAVOUR,
            "convergence_grpc_server": peers.CONVERGENCE_SERVER,
            "throughput_rule": "best round (other tenants of the machine only take CPU away)",
            "latency_rule": "h2load --rps per client x clients = half of Flywheel's saturated Select/s "
            "(first round), same rate for every target; percentiles from h2load --log-file, "
            f"first {p.latency_skip_s:g} s dropped",
            "ratio_rule": "Flywheel Select/s / peer Select/s; goal met when ratio >= goal",
        },
        "figures": figures,
        "ratios": ratios,
        "goals": GOALS,
    }
    print(render(result, targets))
    benchstamp.write_results("select", result, out=args.out)
    return 0


def segmented_comparison(figures: dict[str, Any]) -> dict[str, Any]:
    """Segmented Select beside unsegmented: latency at the common rate (same round pick as the
    table), saturated Select/s and CPU per Select, each as segmented / unsegmented."""
    seg, flat = figures["flywheel_segmented"], figures["flywheel"]
    ls, lf = seg["latency_at_common_rate"], flat["latency_at_common_rate"]
    out = {
        "p50_ms": [ls.get("p50_ms"), lf.get("p50_ms")],
        "p99_ms": [ls.get("p99_ms"), lf.get("p99_ms")],
        "p50_ratio": ls.get("p50_ms", float("nan")) / lf.get("p50_ms", float("nan")),
        "p99_ratio": ls.get("p99_ms", float("nan")) / lf.get("p99_ms", float("nan")),
        "select_rps_ratio": seg["select_rps"] / flat["select_rps"],
        "cpu_us_per_select_ratio": seg["cpu_us_per_select"] / flat["cpu_us_per_select"],
        "p50_goal": SEGMENTED_P50_GOAL,
    }
    out["p50_goal_met"] = bool(out["p50_ratio"] <= SEGMENTED_P50_GOAL)
    return out


def render(result: dict[str, Any], targets: list[str]) -> str:
    f, p = result["figures"], result["params"]
    log = f["flywheel_decision_log"]
    lines = [
        f"Select on core {p['server_cpu']} ({result['machine']['cpu']}), h2load on core {p['loadgen_cpu']}: "
        f"{p['clients']} connections x {p['streams']} streams, {p['saturate_s']:g} s, best of {p['rounds']} round(s); "
        f"Flywheel's gRPC server: {f['flywheel_grpc_server']}",
        f"latency at {f['latency_common_rate_rps']:.0f} req/s offered to every target (half of Flywheel's Select/s); "
        f"SelectBatch of {p['batch_size']}",
        "",
        f"{'target':<15} {'Select/s':>9} {'per round':>11} {'cpu':>5} {'us/Select':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'batch dec/s':>11} {'shed':>5}",
    ]
    for name in targets:
        t = f[name]
        lat = t["latency_at_common_rate"]
        rounds = "/".join(f"{x:.0f}" for x in t["select_rps_rounds"])
        lines.append(
            f"{name:<15} {t['select_rps']:9.0f} {rounds:>11} {t['server_cpu_util']:5.2f} {t['cpu_us_per_select']:9.0f} "
            f"{lat.get('p50_ms', float('nan')):7.2f} {lat.get('p99_ms', float('nan')):7.2f} "
            f"{t['select_batch_decisions_per_s']:11.0f} {t['select_batch_shed_fraction']:5.0%}"
        )
    lines += [
        "(cpu: the server's CPU seconds per second at saturation, below 1 when other tenants took core 1;",
        " batch dec/s: decisions answered per second by SelectBatch; shed: calls answered RESOURCE_EXHAUSTED",
        " because more decisions waited to be written than the decision log's bound),",
        " us/Select: its CPU time per Select, median of rounds)",
        "",
        f"Flywheel decision log: {log['rows_in_postgresql']:,} rows in PostgreSQL for "
        f"{log['decisions_made']:,} decisions made; {log['flush_failures_logged']} failed flushes"
        + ("" if log["complete"] else f"  INCOMPLETE: {log['first_flush_error'][:160]}"),
        "",
        f"{'ratio (Flywheel / peer Select/s)':<44} {'value':>7} {'cpu-norm':>8} {'goal':>6}  met",
    ]
    norm = f["ratios_cpu_normalized"]
    for name, value in result["ratios"].items():
        goal = result["goals"].get(name)
        met = "" if goal is None else ("yes" if value >= goal else "NO")
        cn = f"{norm[name]:8.3f}" if name in norm else f"{'':>8}"
        lines.append(f"{name:<44} {value:7.3f} {cn} {'' if goal is None else f'{goal:6.2f}':>6}  {met}")
    if "segmented_vs_unsegmented" in f:
        c = f["segmented_vs_unsegmented"]
        lines += [
            "",
            f"segmented endpoint (segment_key={SEGMENT_KEY!r}) / unsegmented, at the common rate: "
            f"p50 {c['p50_ms'][0]:.2f} / {c['p50_ms'][1]:.2f} ms = {c['p50_ratio']:.2f}x "
            f"(goal <= {c['p50_goal']:g}x: {'met' if c['p50_goal_met'] else 'NOT met'}), "
            f"p99 {c['p99_ms'][0]:.2f} / {c['p99_ms'][1]:.2f} ms = {c['p99_ratio']:.2f}x; "
            f"Select/s {c['select_rps_ratio']:.2f}x, CPU per Select {c['cpu_us_per_select_ratio']:.2f}x",
        ]
    lines.append(f"({f['seconds']} s)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
