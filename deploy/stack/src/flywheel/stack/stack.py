"""The local stack: real NATS (JetStream), PostgreSQL and S3 on free loopback ports with
data under one folder, the services on top, and a state file so ``down`` in another
process stops everything by pid. The test suite uses the same classes."""

from __future__ import annotations

import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flywheel.api.subjects import ROLES
from flywheel.stack.servers import NatsServer, PostgresServer, S3Server
from flywheel.stack.services import MIGRATED, SERVICES, ServiceProcess, migrate

STATE_FILE = "stack.json"
SECRETS_FILE = "secrets.json"
# Roles with a NATS user of their own (the admin is NatsServer.user).
NATS_ROLES = tuple(role for role, spec in ROLES.items() if spec.uses_bus and not spec.unrestricted)


def _secrets(root: Path) -> dict[str, str]:
    """Generated passwords, kept (mode 0600) beside the data they protect: PostgreSQL's
    data folder remembers the password it was initialised with. ``nats`` is the NATS admin's,
    ``nats:<role>`` each role's (added to an older file on the next ``up``)."""
    path = root / SECRETS_FILE
    found: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    wanted = ["nats", "postgres", "s3"] + [f"nats:{role}" for role in NATS_ROLES]
    missing = [name for name in wanted if name not in found]
    if missing:
        root.mkdir(parents=True, exist_ok=True)
        found.update({name: secrets.token_urlsafe(18) for name in missing})
        path.touch(mode=0o600)
        path.write_text(json.dumps(found))
    return found


@dataclass
class Servers:
    """The three infrastructure servers (PostgreSQL absent when DATABASE_URL is given)."""

    nats: NatsServer
    s3: S3Server
    postgres: PostgresServer | None
    external_database_url: str | None = None

    @classmethod
    def create(cls, root: Path, *, namespace: str | None = None) -> Servers:
        """Servers with data under ``root``; a second ``up`` on the same data reuses its secrets.
        ``namespace`` pins the NATS users' permissions to it; None (tests, benches) lets them
        work in every namespace."""
        external = os.environ.get("DATABASE_URL")
        secrets = _secrets(root)
        return cls(
            nats=NatsServer(
                root / "nats",
                password=secrets["nats"],
                role_passwords={role: secrets[f"nats:{role}"] for role in NATS_ROLES},
                namespace=namespace,
            ),
            s3=S3Server(root / "s3", secret_key=secrets["s3"]),
            postgres=None if external else PostgresServer(root / "postgres", password=secrets["postgres"]),
            external_database_url=external,
        )

    def all(self) -> list[NatsServer | S3Server | PostgresServer]:
        return [s for s in (self.nats, self.postgres, self.s3) if s is not None]

    def start(self) -> None:
        for server in self.all():
            server.start()

    def stop(self) -> None:
        for server in reversed(self.all()):
            server.stop()

    @property
    def database_url(self) -> str:
        if self.postgres is not None:
            return self.postgres.async_url()
        assert self.external_database_url
        return self.external_database_url

    def env(
        self,
        *,
        namespace: str = "flywheel",
        schema: str = "public",
        bucket_prefix: str = "flywheel",
        nats_role: str = "admin",
    ) -> dict[str, str]:
        """The FLYWHEEL_* variables that point a client at these servers, with the NATS user of
        ``nats_role`` (the unrestricted admin by default; "product" for the SDK)."""
        user, password = self.nats.credentials(nats_role)
        return {
            "FLYWHEEL_NATS_URL": self.nats.url,
            "FLYWHEEL_NATS_USER": user,
            "FLYWHEEL_NATS_PASSWORD": password,
            "FLYWHEEL_NATS_NAMESPACE": namespace,
            "FLYWHEEL_DB_URL": self.database_url,
            "FLYWHEEL_DB_SCHEMA": schema,
            "FLYWHEEL_S3_ENDPOINT": self.s3.endpoint,
            "FLYWHEEL_S3_ACCESS_KEY": self.s3.access_key,
            "FLYWHEEL_S3_SECRET_KEY": self.s3.secret_key,
            "FLYWHEEL_S3_BUCKET_PREFIX": bucket_prefix,
        }

    def service_env(
        self, service: str, *, namespace: str = "flywheel", schema: str = "public", bucket_prefix: str = "flywheel"
    ) -> dict[str, str]:
        """``env()`` for one service: its own NATS user, or none for a service that never uses
        the bus."""
        if ROLES[service].uses_bus:
            return self.env(namespace=namespace, schema=schema, bucket_prefix=bucket_prefix, nats_role=service)
        env = self.env(namespace=namespace, schema=schema, bucket_prefix=bucket_prefix)
        del env["FLYWHEEL_NATS_USER"], env["FLYWHEEL_NATS_PASSWORD"]
        return env

    def to_state(self) -> dict[str, object]:
        return {
            "nats": self.nats.to_state(),
            "s3": self.s3.to_state(),
            "postgres": self.postgres.to_state() if self.postgres else None,
            "external_database_url": self.external_database_url,
        }

    @classmethod
    def from_state(cls, state: dict[str, object]) -> Servers:
        pg = state.get("postgres")
        return cls(
            nats=NatsServer.from_state(state["nats"]),  # type: ignore[arg-type]
            s3=S3Server.from_state(state["s3"]),  # type: ignore[arg-type]
            postgres=PostgresServer.from_state(pg) if pg else None,  # type: ignore[arg-type]
            external_database_url=state.get("external_database_url"),  # type: ignore[arg-type]
        )


def link_services(procs: dict[str, ServiceProcess]) -> None:
    """Tell services where the others they call are: the trainer enrols canaries in the
    optimizer and asks the reward judge for rewards and win rates; the society reads runs
    from the optimizer, ranks SAO pairs with the reward judge, reads an endpoint's prompts
    from the trace store and submits jobs to the trainer."""
    links = {
        "trainer": {
            "optimizer": "FLYWHEEL_TRAINER_OPTIMIZER_ADDRESS",
            "reward_judge": "FLYWHEEL_TRAINER_JUDGE_ADDRESS",
        },
        "society": {
            "optimizer": "FLYWHEEL_SOCIETY_OPTIMIZER_ADDRESS",
            "reward_judge": "FLYWHEEL_SOCIETY_JUDGE_ADDRESS",
            "trainer": "FLYWHEEL_SOCIETY_TRAINER_ADDRESS",
            "trace_store": "FLYWHEEL_SOCIETY_TRACE_STORE_ADDRESS",
        },
    }
    for caller, targets in links.items():
        if caller not in procs:
            continue
        for target, variable in targets.items():
            if target in procs:
                procs[caller].env.setdefault(variable, procs[target].address)


class Stack:
    """Servers plus services under one data folder."""

    def __init__(self, root: Path, servers: Servers, services: dict[str, ServiceProcess]) -> None:
        self.root = root
        self.servers = servers
        self.services = services

    @classmethod
    def create(cls, root: Path, *, services: tuple[str, ...] = SERVICES) -> Stack:
        root.mkdir(parents=True, exist_ok=True)
        servers = Servers.create(root, namespace="flywheel")
        procs = {
            name: ServiceProcess(name, env=servers.service_env(name), log_dir=root / "services") for name in services
        }
        link_services(procs)
        return cls(root, servers, procs)

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    def up(self, *, timeout_s: float = 60.0) -> None:
        """Start servers, migrate, start services and wait until each is SERVING."""
        self.prepare()
        self.start_services(timeout_s=timeout_s)

    def prepare(self) -> None:
        """Start the servers and migrate every service that owns tables (``up``'s first half:
        a caller may do other work before ``start_services``)."""
        self.servers.start()
        self.save()
        env = self.servers.env()
        # At once: each migration is a process importing its service (seconds), into its own
        # tables and version table; the schema (public) exists already, so none races another.
        names = [name for name in MIGRATED if name in self.services]
        with ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="migrate") as pool:
            for done in [pool.submit(migrate, name, env) for name in names]:
                done.result()

    def start_services(self, *, timeout_s: float = 60.0) -> None:
        """Start every service (after ``prepare``) and wait until each is SERVING."""
        for proc in self.services.values():
            proc.start()
        self.save()
        for proc in self.services.values():
            proc.wait_serving(timeout_s)

    def down(self) -> None:
        """Stop services (SIGTERM, drain) then servers; remove the state file."""
        for proc in self.services.values():
            proc.stop()
        self.servers.stop()
        self.state_file.unlink(missing_ok=True)

    def save(self) -> None:
        state = {
            "servers": self.servers.to_state(),
            "services": {
                n: {"grpc_port": p.grpc_port, "metrics_port": p.metrics_port} for n, p in self.services.items()
            },
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        self.state_file.chmod(0o600)  # it holds the generated passwords

    @classmethod
    def load(cls, root: Path) -> Stack:
        """Reattach to a stack started by another process (for ``down`` and ``status``)."""
        state = json.loads((root / STATE_FILE).read_text())
        servers = Servers.from_state(state["servers"])
        procs = {
            n: ServiceProcess(
                n,
                env=servers.service_env(n),
                log_dir=root / "services",
                grpc_port=s["grpc_port"],
                metrics_port=s["metrics_port"],
            )
            for n, s in state["services"].items()
        }
        link_services(procs)
        return cls(root, servers, procs)
