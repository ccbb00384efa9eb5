"""The probe the chart renders when gRPC uses TLS (kubelet's native gRPC probe cannot speak
TLS), run for real: against a reward judge serving mTLS it passes once the judge is SERVING,
and with a CA the server was not issued by it fails."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme

from .chart import FULL, helm_binary, named, render

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
TLS_DIR = "/etc/flywheel/grpc-tls"


def write_pki(folder: Path, ca: trustme.CA, name: str) -> None:
    """The files of the chart's grpc-tls Secret (tls.crt, tls.key, ca.crt)."""
    folder.mkdir(parents=True)
    cert = ca.issue_cert(name)
    (folder / "tls.crt").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    (folder / "tls.key").write_bytes(cert.private_key_pem.bytes())
    (folder / "ca.crt").write_bytes(ca.cert_pem.bytes())


def probe_command(address: str, tls_dir: Path) -> list[str]:
    """The reward judge's rendered readiness probe, pointed at this test's files and port."""
    docs = render("external-tls")
    container = named(docs, "Deployment", "reward-judge")["spec"]["template"]["spec"]["containers"][0]
    cmd = container["readinessProbe"]["exec"]["command"]
    assert cmd[:2] == ["python", "-c"] and "127.0.0.1:50053" in cmd[2]
    return [sys.executable, "-c", cmd[2].replace(TLS_DIR, str(tls_dir)).replace("127.0.0.1:50053", address)]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


async def test_tls_probe_checks_grpc_health(launch, tmp_path: Path) -> None:
    if not helm_binary():
        pytest.skip("helm is not installed here: `bash scripts/setup.sh` extracts it into .tools/bin (CI runs it)")
    pki, stranger = tmp_path / "pki", tmp_path / "stranger"
    write_pki(pki, trustme.CA(), f"{FULL}-reward-judge")
    write_pki(stranger, trustme.CA(), f"{FULL}-reward-judge")
    env = {
        "FLYWHEEL_REWARD_JUDGE_TLS_CERT_FILE": str(pki / "tls.crt"),
        "FLYWHEEL_REWARD_JUDGE_TLS_KEY_FILE": str(pki / "tls.key"),
        "FLYWHEEL_REWARD_JUDGE_TLS_CLIENT_CA_FILE": str(pki / "ca.crt"),
        "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
    }
    judge = launch("reward_judge", env=env, wait=False)
    probe = probe_command(judge.address, pki)

    deadline = time.monotonic() + 90
    while (result := await asyncio.to_thread(run, probe)).returncode != 0:
        assert time.monotonic() < deadline, f"probe never passed: {result.stderr[-2000:]}\n{judge.log_tail()}"
        await asyncio.sleep(0.5)

    untrusted = await asyncio.to_thread(run, probe_command(judge.address, stranger))
    assert untrusted.returncode != 0
