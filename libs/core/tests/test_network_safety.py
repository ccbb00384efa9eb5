"""Safe network defaults: what counts as loopback, when a service refuses to listen, when a
client refuses to send its token, and the client-side TLS helper's checks."""

from __future__ import annotations

import os

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from flywheel.api.tls import ClientTls, is_loopback, target_host
from flywheel.core.grpc_server import build_server
from flywheel.core.settings import ServiceSettings, client_link_problem, load_settings


class JudgeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_REWARD_JUDGE_", extra="ignore")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("FLYWHEEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost", "LOCALHOST", "::ffff:127.0.0.1"]
)
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "[::]", "", "10.0.0.1", "192.168.1.20", "fd00::2", "example.com", "judge", "128.0.0.1"]
)
def test_hosts_reachable_from_elsewhere(host):
    assert not is_loopback(host)


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("127.0.0.1:50051", "127.0.0.1"),
        ("[::1]:50051", "::1"),
        ("judge.internal:50054", "judge.internal"),
        ("dns:///judge.internal:50054", "judge.internal"),
        ("dns://8.8.8.8/judge.internal:50054", "judge.internal"),
        ("ipv4:10.0.0.1:50054", "10.0.0.1"),
        ("unix:/run/flywheel/judge.sock", "localhost"),
        ("localhost", "localhost"),
    ],
)
def test_target_host(target, host):
    assert target_host(target) == host


def test_default_service_listens_on_loopback_only(env):
    settings = load_settings(JudgeSettings)
    assert settings.grpc_host == "127.0.0.1" and settings.metrics_host == "127.0.0.1"
    assert settings.exposure_warnings() == []


def test_open_listener_without_credentials_exits_2_naming_the_variables(env, capsys):
    env.setenv("FLYWHEEL_REWARD_JUDGE_GRPC_HOST", "0.0.0.0")
    with pytest.raises(SystemExit) as exc:
        load_settings(JudgeSettings)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for name in (
        "FLYWHEEL_REWARD_JUDGE_GRPC_HOST='0.0.0.0'",
        "FLYWHEEL_REWARD_JUDGE_AUTH_TOKEN",
        "FLYWHEEL_REWARD_JUDGE_TLS_CERT_FILE",
        "FLYWHEEL_REWARD_JUDGE_TLS_KEY_FILE",
        "FLYWHEEL_REWARD_JUDGE_ALLOW_INSECURE=true",
    ):
        assert name in err, err


@pytest.mark.parametrize("host", ["::", "10.0.0.1", "judge.internal"])
def test_any_reachable_address_needs_credentials(host):
    with pytest.raises(ValidationError, match="reachable from other machines"):
        JudgeSettings(grpc_host=host)


def test_a_token_opens_the_listener_but_warns_it_travels_in_plaintext():
    settings = JudgeSettings(grpc_host="0.0.0.0", auth_token="s3cret")
    assert ["plaintext" in w for w in settings.exposure_warnings()] == [True]


def test_tls_opens_the_listener_without_warnings(tmp_path):
    cert = tmp_path / "server.pem"
    key = tmp_path / "server.key"
    issued = trustme.CA().issue_cert("judge.internal")
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    settings = JudgeSettings(grpc_host="0.0.0.0", tls_cert_file=cert, tls_key_file=key)
    assert settings.exposure_warnings() == []


def test_allow_insecure_opens_the_listener_with_a_warning():
    settings = JudgeSettings(grpc_host="0.0.0.0", allow_insecure=True)
    [warning] = settings.exposure_warnings()
    assert "no token and no TLS" in warning and "FLYWHEEL_REWARD_JUDGE_ALLOW_INSECURE" in warning


def test_tls_files_must_exist_and_come_in_pairs(tmp_path):
    with pytest.raises(ValidationError, match="tls_cert_file"):
        JudgeSettings(tls_cert_file=tmp_path / "missing.pem", tls_key_file=tmp_path / "missing.key")
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ValidationError, match="FLYWHEEL_REWARD_JUDGE_TLS_KEY_FILE"):
        JudgeSettings(tls_cert_file=cert)
    with pytest.raises(ValidationError, match="mTLS"):
        JudgeSettings(tls_client_ca_file=cert)


NAMES = {"address": "X_ADDRESS", "tls": "X_TLS", "allow_insecure": "X_ALLOW_INSECURE"}


def test_a_token_goes_to_a_remote_address_only_over_tls():
    problem = client_link_problem(
        name="judge", address="judge.internal:50054", token=True, tls=False, allow_insecure=False, env=NAMES
    )
    assert problem and "X_TLS" in problem and "X_ALLOW_INSECURE" in problem and "plaintext" in problem
    for ok in (
        {"address": "judge.internal:50054", "token": True, "tls": True, "allow_insecure": False},
        {"address": "judge.internal:50054", "token": True, "tls": False, "allow_insecure": True},
        {"address": "judge.internal:50054", "token": False, "tls": False, "allow_insecure": False},
        {"address": "127.0.0.1:50054", "token": True, "tls": False, "allow_insecure": False},
        {"address": "[::1]:50054", "token": True, "tls": False, "allow_insecure": False},
        {"address": "", "token": True, "tls": False, "allow_insecure": False},
    ):
        assert client_link_problem(name="judge", env=NAMES, **ok) is None, ok


def test_client_tls_needs_cert_and_key_together_and_names_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="private key"):
        ClientTls(certificate_chain=b"cert")
    with pytest.raises(ValueError, match=r"TLS CA file .*nope\.pem"):
        ClientTls.from_files(ca_file=tmp_path / "nope.pem")
    tls = ClientTls(b"ca", b"cert", b"SECRET-KEY", "judge.internal")
    assert tls.options() == [("grpc.ssl_target_name_override", "judge.internal")]
    assert "SECRET" not in repr(tls) and "client certificate" in repr(tls)


def test_metrics_tls_needs_the_servers_certificate():
    with pytest.raises(ValidationError, match="FLYWHEEL_REWARD_JUDGE_TLS_CERT_FILE"):
        JudgeSettings(metrics_tls=True)


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
async def test_the_server_listens_on_the_loopback_address_it_is_given(host):
    server, _, port = build_server(ServiceSettings(grpc_host=host, grpc_port=0), [])
    await server.start()
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        async with grpc.aio.insecure_channel(target) as ch:
            got = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)
