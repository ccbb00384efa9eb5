"""TLS for clients of Flywheel's gRPC servers, and the loopback test every listener uses.

One helper for every client that dials a Flywheel service: the SDK and the ``flywheel``
CLI (in a product's process) and the evaluator's reward-judge client (a service), so a CA
bundle, an mTLS client certificate and a server-name override mean the same everywhere.
It lives here, in flywheel-api, because that is the one package both the SDK (which must
not pull the services' core: SQLAlchemy, asyncpg, MinIO …) and the services depend on.

    tls = ClientTls.from_files(ca_file="ca.pem", cert_file="client.pem", key_file="client.key")
    channel = aio_channel("judge.internal:50054", tls)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

_Options = Sequence[tuple[str, Any]]


@dataclass(frozen=True, repr=False)
class ClientTls:
    """What a client needs to reach a server over TLS. Every field is optional: no CA means
    the system's roots, a certificate and key make it mTLS, ``server_name`` is checked
    against the server's certificate instead of the host in the address (an IP, or a
    name the certificate does not carry)."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("a TLS client certificate needs its private key, and a key its certificate")

    def __repr__(self) -> str:  # never print key material
        parts = [
            "ca" if self.root_certificates else "system roots",
            *(["client certificate"] if self.certificate_chain else []),
            *([f"server_name={self.server_name!r}"] if self.server_name else []),
        ]
        return f"ClientTls({', '.join(parts)})"

    @classmethod
    def from_files(
        cls,
        *,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        server_name: str | None = None,
    ) -> ClientTls:
        """Read PEM files; a file that cannot be read raises ValueError naming it."""

        def read(what: str, path: str | Path | None) -> bytes | None:
            if path is None or str(path) == "":
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"TLS {what} {path}: {exc.strerror or exc}") from None

        return cls(
            root_certificates=read("CA file", ca_file),
            certificate_chain=read("certificate file", cert_file),
            private_key=read("key file", key_file),
            server_name=server_name or None,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def channel(target: str, tls: ClientTls | None, *, options: _Options = ()) -> grpc.Channel:
    """A blocking channel: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.credentials(), options=[*options, *tls.options()])


def aio_channel(target: str, tls: ClientTls | None, *, options: _Options = ()) -> grpc.aio.Channel:
    """An asyncio channel: TLS when ``tls`` is given, plaintext otherwise."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, tls.credentials(), options=[*options, *tls.options()])


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: 127.0.0.0/8, ::1 and ``localhost``.

    Any other name counts as reachable from elsewhere: what it resolves to is not known
    until it is resolved, and can change. ``0.0.0.0``, ``::`` and ``""`` mean every interface.
    """
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def target_host(target: str) -> str:
    """The host part of a gRPC target: ``host:port``, ``[::1]:50051``, ``dns:///host:port``,
    ``ipv4:127.0.0.1:50051``; ``localhost`` for ``unix:`` sockets (local by nature)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return "localhost"
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :].split(",", 1)[0]
            if "/" in target:  # dns://authority/host:port
                target = target.rsplit("/", 1)[1]
            break
    if target.startswith("["):
        return target[1 : target.find("]")] if "]" in target else target[1:]
    if target.count(":") > 1:  # a bare IPv6 address without a port
        return target
    return target.rsplit(":", 1)[0] if ":" in target else target
