"""Safe network defaults and TLS on every link, with real processes and a CA made here.

- The optimizer with server TLS and mTLS: the CLI and the SDK reach it with a client
  certificate (and the server-name override its certificate needs); without a client
  certificate, with one from another CA, or in plaintext, they are refused.
- The evaluator calls the reward judge over mTLS with its bearer token: an llm_judge
  metric is scored by the judge's LLM; without a client certificate the judge refuses it.
  The judge's /metrics is HTTPS with the same certificate and client CA.
- A service told to listen on 0.0.0.0 without token or TLS does not start (exit 2, naming
  the variables); with a token it starts; with ALLOW_INSECURE it starts and warns. By
  default gRPC and metrics listen on loopback only.
- The model server likewise (exit 2 before it loads a model), and serves HTTPS.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import trustme
from google.protobuf.struct_pb2 import Struct
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest, EvaluationResult, Metric, MetricType, Target
from flywheel.api.evaluator.v1.events_pb2 import TestCase as CaseMessage
from flywheel.api.subjects import Catalogue
from flywheel.api.tls import ClientTls, channel
from flywheel.reward_judge.testing.scripted_llm import ScriptedLlm
from flywheel.sdk.admin import AdminClient
from flywheel.sdk.client import FlywheelClient
from flywheel.sdk.sync import SyncFlywheelClient
from flywheel.stack.servers import free_port, free_ports, process_alive
from flywheel.stack.services import ServiceProcess

pytestmark = pytest.mark.integration

# The servers' certificates name only this: reaching them at 127.0.0.1 needs the override.
SERVER_NAME = "flywheel.test"
TOKEN = "judge-token-for-tests"


class Pki:
    """PEM files of a CA made for this module: a server certificate, a client certificate,
    and a client certificate from a CA the servers do not trust."""

    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        stranger_ca = trustme.CA()
        self.root = root
        self.ca = self._write("ca.pem", ca.cert_pem.bytes())
        self.server_cert, self.server_key = self._pair("server", ca.issue_cert(SERVER_NAME))
        self.client_cert, self.client_key = self._pair("client", ca.issue_cert("product.flywheel.test"))
        self.stranger_cert, self.stranger_key = self._pair("stranger", stranger_ca.issue_cert("product.flywheel.test"))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        return path

    def _pair(self, name: str, issued: trustme.LeafCert) -> tuple[Path, Path]:
        chain = b"".join(blob.bytes() for blob in issued.cert_chain_pems)
        return self._write(f"{name}.pem", chain), self._write(f"{name}.key", issued.private_key_pem.bytes())

    def client_tls(self, *, cert: bool = True, server_name: str | None = SERVER_NAME) -> ClientTls:
        return ClientTls.from_files(
            ca_file=self.ca,
            cert_file=self.client_cert if cert else None,
            key_file=self.client_key if cert else None,
            server_name=server_name,
        )

    def server_env(self, service: str, *, mtls: bool = True) -> dict[str, str]:
        prefix = f"FLYWHEEL_{service.upper()}_"
        env = {f"{prefix}TLS_CERT_FILE": str(self.server_cert), f"{prefix}TLS_KEY_FILE": str(self.server_key)}
        if mtls:
            env[f"{prefix}TLS_CLIENT_CA_FILE"] = str(self.ca)
        return env


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def wait_serving_tls(proc: ServiceProcess, tls: ClientTls, timeout_s: float = 60.0) -> None:
    """``proc.wait_serving`` over TLS (its own health check speaks plaintext)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.pid is None or not process_alive(proc.pid):
            raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
        with channel(proc.address, tls) as ch:
            try:
                got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.2)
    raise TimeoutError(f"{proc.name} not SERVING over TLS after {timeout_s}s:\n{proc.log_tail()}")


# ---- SDK and CLI -> optimizer over mTLS -------------------------------------------------

ENDPOINT_YAML = """\
name: tls-bot
arms:
  - arm_id: small
    params: {model: small}
  - arm_id: large
    params: {model: large}
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run(
        [sys.executable, "-m", "flywheel.sdk.cli", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_sdk_and_cli_reach_an_mtls_optimizer_with_a_client_certificate_only(launch, pki, tmp_path):
    optimizer = launch("optimizer", env=pki.server_env("optimizer"), wait=False)
    await asyncio.to_thread(wait_serving_tls, optimizer, pki.client_tls())
    endpoint_file = tmp_path / "endpoint.yaml"
    endpoint_file.write_text(ENDPOINT_YAML)
    target = ["--target", optimizer.address]

    # The CLI: flags for CA and server name, environment variables for the client certificate.
    mtls_env = {"FLYWHEEL_TLS_CERT_FILE": str(pki.client_cert), "FLYWHEEL_TLS_KEY_FILE": str(pki.client_key)}
    tls_flags = ["--tls-ca", str(pki.ca), "--tls-server-name", SERVER_NAME]
    applied = cli("endpoint", "apply", str(endpoint_file), *target, *tls_flags, env=mtls_env)
    assert applied.returncode == 0, applied.stderr
    assert "applied" in applied.stdout
    listed = cli("endpoint", "list", *target, *tls_flags, "--tls-cert", str(pki.client_cert), "--tls-key",
                 str(pki.client_key), env={})  # fmt: skip
    assert listed.returncode == 0 and "tls-bot" in listed.stdout, listed.stderr

    stranger = ["--tls-cert", str(pki.stranger_cert), "--tls-key", str(pki.stranger_key)]
    refusals = {
        "no client certificate": cli("endpoint", "list", *target, *tls_flags, env={}),
        "a stranger's certificate": cli("endpoint", "list", *target, *tls_flags, *stranger, env={}),
        "no server-name override": cli("endpoint", "list", *target, "--tls-ca", str(pki.ca), env=mtls_env),
        "plaintext": cli("endpoint", "list", *target, env={}),
    }
    for why, refused in refusals.items():
        assert refused.returncode == 1, (why, refused.stdout)
        assert "tls-bot" not in refused.stdout, why

    # The SDK: async and blocking product clients, and the admin client.
    mtls: dict[str, Any] = {
        "tls_root_certificates": pki.ca.read_bytes(),
        "tls_certificate_chain": pki.client_cert.read_bytes(),
        "tls_private_key": pki.client_key.read_bytes(),
        "tls_server_name": SERVER_NAME,
    }
    async with FlywheelClient(target=optimizer.address, **mtls) as fw:
        decision = await fw.select("tls-bot", user_id="u1")
    assert decision.arm_id in {"small", "large"}
    with AdminClient(target=optimizer.address, **mtls) as admin:
        assert [ep.name for ep in admin.list()] == ["tls-bot"]

    no_cert = {k: v for k, v in mtls.items() if k not in ("tls_certificate_chain", "tls_private_key")}
    with SyncFlywheelClient(target=optimizer.address, **no_cert) as fw, pytest.raises(grpc.RpcError) as info:
        fw.select("tls-bot", user_id="u1", timeout_s=5.0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with SyncFlywheelClient(target=optimizer.address) as fw, pytest.raises(grpc.RpcError) as info:
        fw.select("tls-bot", user_id="u1", timeout_s=5.0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


# ---- evaluator -> reward judge over mTLS with a token -----------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def llm():
    server = await ScriptedLlm().start()
    yield server
    await server.stop()


def judge_request(request_id: str) -> EvaluationRequest:
    question = Struct()
    question.update({"question": "Paris is the capital of France. [good]"})
    return EvaluationRequest(
        meta=EventMeta(event_id=f"req:{request_id}"),
        request_id=request_id,
        run_id="run-tls",
        candidate_id="cand-1",
        test_case=CaseMessage(test_case_id=f"tc-{request_id}", input=question),
        target=Target(python_callable="flywheel.evaluator.examples:echo"),
        metrics=[Metric(name="quality", type=MetricType.METRIC_TYPE_LLM_JUDGE)],
    )


async def evaluate(nats_client, namespace: str, request_id: str) -> EvaluationResult:
    catalogue = Catalogue(namespace)
    js = nats_client.jetstream()
    await js.publish(catalogue.evaluation_request("run-tls"), judge_request(request_id).SerializeToString())
    sub = await js.pull_subscribe(
        catalogue.evaluation_result("run-tls"), stream=f"{namespace.upper()}_EVALUATION_RESULTS"
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                batch = await sub.fetch(10, timeout=1.0)
            except TimeoutError:  # nothing yet
                continue
            for msg in batch:
                await msg.ack()
                result = EvaluationResult.FromString(msg.data)
                if result.request_id == request_id:
                    return result
        raise TimeoutError(f"no result for {request_id}")
    finally:
        await sub.unsubscribe()


async def test_evaluator_scores_through_the_mtls_judge_with_its_token(launch, pki, llm, nats_client, isolation):
    judge = launch(
        "reward_judge",
        env={
            **pki.server_env("reward_judge"),
            "FLYWHEEL_REWARD_JUDGE_AUTH_TOKEN": TOKEN,
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/judge",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": llm.base_url,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-scripted",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
            "FLYWHEEL_REWARD_JUDGE_METRICS_TLS": "true",
        },
        wait=False,
    )
    await asyncio.to_thread(wait_serving_tls, judge, pki.client_tls())
    # Its /metrics over HTTPS with the same certificate, and mTLS like its gRPC port.
    scraped = https_get(judge.metrics_port, "/metrics", pki.ca, client=(pki.client_cert, pki.client_key))
    assert scraped.startswith(b"HTTP/1.0 200") or scraped.startswith(b"HTTP/1.1 200"), scraped[:100]
    assert b"flywheel_dependency_ready" in scraped
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https_get(judge.metrics_port, "/metrics", pki.ca)
    link = {
        "FLYWHEEL_EVALUATOR_JUDGE_ADDRESS": judge.address,
        "FLYWHEEL_EVALUATOR_JUDGE_AUTH_TOKEN": TOKEN,
        "FLYWHEEL_EVALUATOR_JUDGE_TLS_CA_FILE": str(pki.ca),
        "FLYWHEEL_EVALUATOR_JUDGE_TLS_SERVER_NAME": SERVER_NAME,
    }
    evaluator = launch(
        "evaluator",
        env={
            **link,
            "FLYWHEEL_EVALUATOR_JUDGE_TLS_CERT_FILE": str(pki.client_cert),
            "FLYWHEEL_EVALUATOR_JUDGE_TLS_KEY_FILE": str(pki.client_key),
        },
    )
    scored = await evaluate(nats_client, isolation["namespace"], "over-mtls")
    assert dict(scored.metric_errors) == {}
    assert scored.components["quality"] == pytest.approx(0.9)  # the scripted LLM's 9/10 for "[good]"
    assert llm.calls == 1

    # The same evaluator without its client certificate: the judge's TLS handshake refuses it,
    # and llm_judge is left out of the score with the reason (not scored as zero).
    evaluator.stop()
    launch("evaluator", env=link)
    refused = await evaluate(nats_client, isolation["namespace"], "no-client-cert")
    assert "quality" not in refused.components
    assert "UNAVAILABLE" in refused.metric_errors["quality"], refused.metric_errors
    assert llm.calls == 1


def test_evaluator_refuses_to_send_the_judge_token_in_plaintext(launch):
    env = {**launch.env, "FLYWHEEL_EVALUATOR_JUDGE_ADDRESS": "judge.internal:50054"}
    env["FLYWHEEL_EVALUATOR_JUDGE_AUTH_TOKEN"] = TOKEN
    refused = check_config("evaluator", env)
    assert refused.returncode == 2
    assert "FLYWHEEL_EVALUATOR_JUDGE_TLS" in refused.stderr and "plaintext" in refused.stderr
    assert TOKEN not in refused.stderr + refused.stdout
    for extra in ({"FLYWHEEL_EVALUATOR_JUDGE_TLS": "true"}, {"FLYWHEEL_EVALUATOR_JUDGE_ALLOW_INSECURE": "true"}):
        allowed = check_config("evaluator", {**env, **extra})
        assert allowed.returncode == 0, (extra, allowed.stderr)


def check_config(service: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run(
        [sys.executable, "-m", f"flywheel.{service}", "check-config"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# ---- binding --------------------------------------------------------------------------


def host_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


class Direct:
    """A service process started here, not by the launcher (which pins 127.0.0.1)."""

    def __init__(self, service: str, env: dict[str, str], log: Path) -> None:
        self.grpc_port, self.metrics_port = free_ports(2)  # distinct: chosen with both bound
        prefix = f"FLYWHEEL_{service.upper()}_"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
        full = {
            **clean,
            **env,
            f"{prefix}GRPC_PORT": str(self.grpc_port),
            f"{prefix}METRICS_PORT": str(self.metrics_port),
        }
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"flywheel.{service}"], env=full, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()}"
            with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as ch:
                try:
                    got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if got.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
            time.sleep(0.2)
        raise TimeoutError(self.output())

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def direct(tmp_path: Path) -> Iterator[Any]:
    started: list[Direct] = []

    def start(service: str, env: dict[str, str]) -> Direct:
        proc = Direct(service, env, tmp_path / f"{service}-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_open_address_without_credentials_does_not_start(launch, direct):
    svc = direct("evaluator", {**launch.env, "FLYWHEEL_EVALUATOR_GRPC_HOST": "0.0.0.0"})
    assert svc.proc.wait(60) == 2
    out = svc.output()
    for name in ("FLYWHEEL_EVALUATOR_AUTH_TOKEN", "FLYWHEEL_EVALUATOR_TLS_CERT_FILE", "ALLOW_INSECURE=true"):
        assert name in out, out
    assert not reachable("127.0.0.1", svc.grpc_port)


def test_open_address_with_a_token_starts_and_with_allow_insecure_starts_warning(launch, direct):
    token = direct(
        "evaluator",
        {**launch.env, "FLYWHEEL_EVALUATOR_GRPC_HOST": "0.0.0.0", "FLYWHEEL_EVALUATOR_AUTH_TOKEN": "t0ken"},
    )
    token.wait_serving()
    assert "plaintext" in token.output()  # a token without TLS is allowed, and said to be weak
    assert "no token and no TLS" not in token.output()
    address = host_address()
    if address is not None:
        assert reachable(address, token.grpc_port), "0.0.0.0 should be reachable on the host's address"
    token.stop()

    insecure = direct(
        "evaluator", {**launch.env, "FLYWHEEL_EVALUATOR_GRPC_HOST": "0.0.0.0", "FLYWHEEL_EVALUATOR_ALLOW_INSECURE": "1"}
    )
    insecure.wait_serving()
    out = insecure.output()
    assert "insecure listener" in out and "no token and no TLS" in out, out


def test_by_default_grpc_and_metrics_listen_on_loopback_only(launch, direct):
    address = host_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe from")
    env = {k: v for k, v in launch.env.items() if not k.endswith(("_GRPC_HOST", "_METRICS_HOST"))}
    svc = direct("evaluator", env)
    svc.wait_serving()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics", timeout=5).read()
    assert b"flywheel_" in metrics
    assert not reachable(address, svc.grpc_port)
    assert not reachable(address, svc.metrics_port)


# ---- model server -----------------------------------------------------------------------


def test_model_server_refuses_an_open_address_without_a_key(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_MODELSERVER_")}
    started = time.monotonic()
    refused = subprocess.run(
        [sys.executable, "-m", "flywheel.modelserver", "--host", "0.0.0.0", "--port", str(free_port()),
         "--model", "tiny"],
        env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "FLYWHEEL_MODELSERVER_API_KEY" in refused.stderr and "--allow-insecure" in refused.stderr
    assert time.monotonic() - started < 60  # refused before loading any model


def https_get(port: int, path: str, ca: Path, headers: str = "", client: tuple[Path, Path] | None = None) -> bytes:
    """GET over TLS verified against ``ca``, expecting the certificate's name at 127.0.0.1;
    ``client`` is a certificate and key to present."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(*client)
    request = f"GET {path} HTTP/1.1\r\nHost: {SERVER_NAME}\r\n{headers}Connection: close\r\n\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=SERVER_NAME) as tls,
    ):
        tls.sendall(request.encode())
        return b"".join(iter(lambda: tls.recv(65536), b""))


def test_model_server_serves_https_on_an_open_address(pki, tmp_path):
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_MODELSERVER_")},
        "FLYWHEEL_MODELSERVER_API_KEY": "sk-local",
        "FLYWHEEL_MODELSERVER_TLS_CERT_FILE": str(pki.server_cert),
        "FLYWHEEL_MODELSERVER_TLS_KEY_FILE": str(pki.server_key),
    }
    log = tmp_path / "modelserver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flywheel.modelserver", "--host", "0.0.0.0", "--port", str(port), "--model",
             "tiny", "--cache-dir", str(tmp_path / "cache")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not reachable("127.0.0.1", port):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert https_get(port, "/health", pki.ca).startswith(b"HTTP/1.1 200")
        assert https_get(port, "/v1/models", pki.ca).startswith(b"HTTP/1.1 401")
        models = https_get(port, "/v1/models", pki.ca, "Authorization: Bearer sk-local\r\n")
        assert models.startswith(b"HTTP/1.1 200") and b'"object": "list"' in models.replace(b'":"', b'": "')
        stranger = pki.root / "stranger-ca.pem"
        stranger.write_bytes(trustme.CA().cert_pem.bytes())
        with pytest.raises(ssl.SSLCertVerificationError):  # the certificate is checked, not just any TLS
            https_get(port, "/health", stranger)
        assert "without TLS" not in log.read_text() and "no API key" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
