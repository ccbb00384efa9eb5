"""pytest fixtures over the real servers (loaded by the root conftest.py).

One set of servers per test session (starting PostgreSQL costs seconds); each test
gets a fresh NATS namespace, PostgreSQL schema and bucket prefix, so tests share the
servers without seeing each other's subjects, tables or objects.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as Nats

from flywheel.stack.servers import NatsServer
from flywheel.stack.services import MIGRATED, ServiceProcess, migrate
from flywheel.stack.stack import Servers

# Offline everywhere a model library might be imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def server_root(prefix: str) -> Path:
    """A data folder outside pytest's tmp tree: pytest resets its root to mode 0700 when
    another session starts, which locks out PostgreSQL's unprivileged system user."""
    return Path(tempfile.mkdtemp(prefix=f"flywheel-{prefix}-"))


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    """Real NATS, PostgreSQL and S3 for the whole session."""
    root = server_root("servers")
    found = Servers.create(root)
    try:
        found.start()
        yield found
    finally:
        found.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def isolation() -> dict[str, str]:
    """A fresh namespace, schema and bucket prefix for one test."""
    tag = uuid.uuid4().hex[:10]
    return {"namespace": f"t{tag}", "schema": f"t_{tag}", "bucket_prefix": f"t{tag}"}


@pytest.fixture
def stack_env(servers: Servers, isolation: dict[str, str]) -> dict[str, str]:
    """FLYWHEEL_* variables for services and clients of this test."""
    return servers.env(**isolation)


@pytest.fixture
def launch(stack_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start a service as a real process (migrating first if it owns tables); stopped after the test."""
    started: list[ServiceProcess] = []
    migrated: set[str] = set()

    def _launch(name: str, *, env: dict[str, str] | None = None, wait: bool = True) -> ServiceProcess:
        full_env = {**stack_env, **(env or {})}
        if name in MIGRATED and name not in migrated:
            migrate(name, full_env)
            migrated.add(name)
        proc = ServiceProcess(name, env=full_env, log_dir=tmp_path / "services")
        proc.start()
        started.append(proc)
        if wait:
            proc.wait_serving()
        return proc

    yield _launch
    for proc in reversed(started):
        proc.stop()


@pytest.fixture
async def nats_client(servers: Servers) -> AsyncIterator[Nats]:
    nc = await nats.connect(servers.nats.url, user=servers.nats.user, password=servers.nats.password)
    yield nc
    await nc.close()  # not drain(): draining pull subscriptions waits out its timeout


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A NATS server of this test's own, for tests that stop or kill it."""
    server = NatsServer(tmp_path / "private-nats")
    server.start()
    yield server
    server.stop()
