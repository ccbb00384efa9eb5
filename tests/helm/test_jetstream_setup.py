"""The chart's JetStream setup Job, run for real: its command and rendered environment (only
the NATS address and admin password swapped for the test server's) against a real NATS server
declare every stream and consumer of flywheel.api.subjects, and a second run changes nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import nats
import pytest

from flywheel.api.subjects import Catalogue
from flywheel.stack.stack import Servers

from .chart import container_env, helm_binary, named, render, secret_data

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_setup_job_declares_the_catalogue(servers: Servers, isolation: dict[str, str]) -> None:
    if not helm_binary():
        pytest.skip("helm is not installed here: `bash scripts/setup.sh` extracts it into .tools/bin (CI runs it)")
    docs = render("minimal", "--set", f"nats.namespace={isolation['namespace']}")
    job = named(docs, "Job", "jetstream-setup")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = container_env(docs, container, secret_data(docs, {}), pod_name="setup")
    assert env["FLYWHEEL_NATS_USER"] == "admin" and env["FLYWHEEL_NATS_PASSWORD"] == "admin-pw"
    env |= {"FLYWHEEL_NATS_URL": servers.nats.url, "FLYWHEEL_NATS_PASSWORD": servers.nats.password}
    assert servers.nats.user == "admin"
    cmd = [sys.executable if c == "python" else c for c in container["command"]]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)

    first = await asyncio.to_thread(run)
    assert first.returncode == 0, first.stderr
    cat = Catalogue(isolation["namespace"])
    assert f"declared {len(cat.streams)} streams and {len(cat.consumers)} consumers" in first.stdout

    nc = await nats.connect(servers.nats.url, user=servers.nats.user, password=servers.nats.password)
    try:
        js = nc.jetstream()
        for name, spec in cat.streams.items():
            info = await js.stream_info(name)
            assert info.config.subjects == list(spec.subjects)
        for durable, spec in cat.consumers.items():
            info = await js.consumer_info(spec.stream, durable)
            assert info.config.filter_subject == spec.filter_subject
            assert info.config.max_deliver == spec.max_deliver
        before = {name: (await js.stream_info(name)).config for name in cat.streams}
        second = await asyncio.to_thread(run)
        assert second.returncode == 0, second.stderr
        assert {name: (await js.stream_info(name)).config for name in cat.streams} == before
    finally:
        await nc.close()


def test_setup_job_refuses_missing_settings() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flywheel.core.bus", "declare"], env={}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "FLYWHEEL_NATS_URL" in proc.stderr
