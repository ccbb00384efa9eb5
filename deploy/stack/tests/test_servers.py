"""Start the real servers, use them with real clients, crash and restart them, stop them from saved state."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from flywheel.stack.servers import (
    ManagedServer,
    NatsServer,
    PostgresServer,
    S3Server,
    free_port,
    wait_for,
)


def _stop_from_saved_state(server: ManagedServer) -> None:
    """A fresh object rebuilt from JSON state (as a later `down` command would) stops the server."""
    pid = server.pid
    assert pid is not None and psutil.pid_exists(pid)
    state = json.loads(json.dumps(server.to_state()))
    assert state["pid"] == pid
    other = ManagedServer.from_state(state)
    assert type(other) is type(server) and other.port == server.port
    other.stop()
    assert not psutil.pid_exists(pid)
    assert not server.is_running() and server.pid is None
    other.stop()  # idempotent


def _crash_and_restart(server: ManagedServer) -> None:
    port, pid = server.port, server.pid
    server.kill()
    assert not server.is_running()
    server.start()
    assert server.port == port and server.pid != pid


def test_wait_for_and_free_port() -> None:
    assert wait_for(lambda: 42, timeout=1) == 42
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        wait_for(lambda: False, timeout=0.2, interval=0.05)
    assert time.monotonic() - started < 1
    assert 0 < free_port() < 65536


def test_nats(tmp_path: Path) -> None:
    import nats
    import nats.errors

    server = NatsServer(tmp_path / "nats")
    assert server.password not in server.url
    server.start()
    try:

        async def connect(password: str) -> Any:
            async def quiet(_: Exception) -> None:
                pass

            return await nats.connect(
                server.url,
                user=server.user,
                password=password,
                connect_timeout=2,
                allow_reconnect=False,
                error_cb=quiet,
            )

        async def create_stream() -> None:
            nc = await connect(server.password)
            js = nc.jetstream()
            await js.account_info()
            await js.add_stream(name="EVENTS", subjects=["events.>"])
            await js.publish("events.one", b"hello")
            await nc.close()

        async def wrong_password() -> None:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await connect("not-the-password")

        async def stream_survived() -> None:
            nc = await connect(server.password)
            info = await nc.jetstream().stream_info("EVENTS")
            assert info.state.messages == 1
            await nc.close()

        asyncio.run(create_stream())
        asyncio.run(wrong_password())
        _crash_and_restart(server)
        asyncio.run(stream_survived())
        _stop_from_saved_state(server)
    finally:
        server.stop()


def test_postgres(tmp_path: Path) -> None:
    import asyncpg

    server = PostgresServer(tmp_path / "pg")
    server.start()
    try:
        assert server.async_url().startswith("postgresql+asyncpg://")

        async def write() -> None:
            conn = await asyncpg.connect(server.url)  # the URL's database was created by start()
            assert await conn.fetchval("select 1") == 1
            await conn.execute("create table notes (body text)")
            await conn.execute("insert into notes values ('kept')")
            await conn.close()

        async def wrong_password() -> None:
            with pytest.raises(asyncpg.InvalidPasswordError):
                await asyncpg.connect(
                    host="127.0.0.1", port=server.port, user=server.user, password="nope", database="flywheel"
                )

        async def read() -> None:
            conn = await asyncpg.connect(server.url)
            assert await conn.fetchval("select body from notes") == "kept"
            await conn.close()

        asyncio.run(write())
        asyncio.run(wrong_password())
        _crash_and_restart(server)
        asyncio.run(read())
        _stop_from_saved_state(server)
    finally:
        server.stop()


def test_s3(tmp_path: Path) -> None:
    from minio import Minio
    from minio.error import S3Error

    server = S3Server(tmp_path / "s3")
    server.start()
    try:

        def client(secret: str) -> Minio:
            return Minio(server.endpoint, access_key=server.access_key, secret_key=secret, secure=False)

        good = client(server.secret_key)
        good.make_bucket("artifacts")
        good.put_object("artifacts", "a/b.txt", io.BytesIO(b"payload"), length=7)
        assert good.get_object("artifacts", "a/b.txt").read() == b"payload"
        with pytest.raises(S3Error) as err:
            client("wrong-secret").list_buckets()
        assert err.value.code in {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"}

        _crash_and_restart(server)
        assert client(server.secret_key).get_object("artifacts", "a/b.txt").read() == b"payload"
        _stop_from_saved_state(server)
    finally:
        server.stop()


def test_start_failure_reports_log(tmp_path: Path) -> None:
    """A server that cannot bind its port dies during start(); the error carries its log."""
    first = NatsServer(tmp_path / "a")
    first.start()
    try:
        clash = NatsServer(tmp_path / "b", port=first.port)
        with pytest.raises(RuntimeError, match="last log lines"):
            clash.start(timeout=10)
        assert not clash.is_running() and not clash.pid_file.exists()
    finally:
        first.stop()


def test_stop_from_another_process(tmp_path: Path) -> None:
    """`up` starts a server in one process and exits; `down` in another stops it from the saved state."""
    state_file = tmp_path / "state.json"
    up = (
        "import json, sys; from flywheel.stack.servers import NatsServer; "
        "s = NatsServer(sys.argv[1]); s.start(); open(sys.argv[2], 'w').write(json.dumps(s.to_state()))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", up, str(tmp_path / "nats"), str(state_file)], check=True, env=env)
    server = ManagedServer.from_state(json.loads(state_file.read_text()))
    pid = server.pid
    assert isinstance(server, NatsServer) and server.is_running()  # outlived the process that started it
    server.stop()
    assert not server.is_running() and not server.pid_file.exists()
    assert (pid is not None and not psutil.pid_exists(pid)) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_cpu_seconds_counts_a_process_and_with_children_its_descendants() -> None:
    import math

    from flywheel.stack.servers import cpu_seconds

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds(child.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds(child.pid) >= 0.5  # the child's own spin
        alone, with_children = cpu_seconds(os.getpid()), cpu_seconds(os.getpid(), children=True)
        assert with_children - alone >= 0.5  # ... counted under its parent only with children
    finally:
        child.kill()
        child.wait()
    assert math.isnan(cpu_seconds(child.pid))  # gone
    assert math.isnan(cpu_seconds(None))
