"""What every ``flywheel`` command shares: the service it talks to and how it connects
(address, bearer token, TLS), the connection flags, one-line errors and plain tables.

Each command's parser names its service with ``parser.set_defaults(service=TRAINER)``; a
command without one talks to the optimizer. The address is ``--target``, else the service's
variable (``$FLYWHEEL_OPTIMIZER_ADDRESS``, ``$FLYWHEEL_TRAINER_ADDRESS``), else its default port
on 127.0.0.1; token and TLS are the same for every service.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from flywheel.api.ports import TRAINER_GRPC_PORT
from flywheel.api.values import plain_number
from flywheel.sdk._transport import tls_from_env


class CliError(Exception):
    """A problem to report as one line, exit code 1."""


@dataclass(frozen=True)
class Service:
    """A service the CLI talks to: its name in messages, its address variable and default."""

    name: str
    env: str
    default: str


OPTIMIZER = Service("optimizer", "FLYWHEEL_OPTIMIZER_ADDRESS", "127.0.0.1:50051")
TRAINER = Service("trainer", "FLYWHEEL_TRAINER_ADDRESS", f"127.0.0.1:{TRAINER_GRPC_PORT}")


def service_of(args: argparse.Namespace) -> Service:
    service = getattr(args, "service", None)
    return service if isinstance(service, Service) else OPTIMIZER


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def one_line(text: str) -> str:
    return " ".join(text.split())


# flag and client argument; TLS is on when any of them (or its FLYWHEEL_TLS_* variable) is set.
TLS_FLAGS = (
    ("--tls-ca", "tls_root_certificates"),
    ("--tls-cert", "tls_certificate_chain"),
    ("--tls-key", "tls_private_key"),
)


def connection(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a ``BlockingClient`` for the command's service; records the
    address in ``args.resolved_target`` for error messages."""
    service = service_of(args)
    target = getattr(args, "target", None) or os.environ.get(service.env) or service.default
    args.resolved_target = target
    token = os.environ.get("FLYWHEEL_AUTH_TOKEN") or None
    token_file = getattr(args, "auth_token_file", None)
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--auth-token-file {token_file}: {exc.strerror or exc}") from None
    try:
        tls = tls_from_env(os.environ)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for flag, key in TLS_FLAGS:  # a flag wins over its environment variable
        path = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if path is not None:
            try:
                tls[key] = Path(path).read_bytes()
            except OSError as exc:
                raise CliError(f"{flag} {path}: {exc.strerror or exc}") from None
    if ("tls_certificate_chain" in tls) != ("tls_private_key" in tls):
        raise CliError("--tls-cert and --tls-key go together ($FLYWHEEL_TLS_CERT_FILE, $FLYWHEEL_TLS_KEY_FILE)")
    if getattr(args, "tls_server_name", None):
        tls["tls_server_name"] = args.tls_server_name
    return {
        "target": target,
        "auth_token": token,
        **tls,
        "timeout_s": getattr(args, "timeout", None) or 10.0,
    }


def connection_options(parser: argparse.ArgumentParser, service: Service | None = OPTIMIZER) -> None:
    """The connection flags; ``service`` None (the top-level parser) describes them for any."""
    group = parser.add_argument_group("connection")
    if service is None:
        where = (
            f"default ${OPTIMIZER.env} or {OPTIMIZER.default}; train and policies: ${TRAINER.env} or {TRAINER.default}"
        )
        what = "gRPC address of the command's service"
    else:
        where = f"default ${service.env} or {service.default}"
        what = f"{service.name} gRPC address"
    group.add_argument("--target", metavar="HOST:PORT", default=argparse.SUPPRESS, help=f"{what} ({where})")
    group.add_argument(
        "--auth-token-file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="file holding the bearer token (default $FLYWHEEL_AUTH_TOKEN)",
    )
    group.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="PEM root certificates: connect with TLS (default $FLYWHEEL_TLS_CA_FILE)",
    )
    group.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="PEM client certificate, for a server that requires mTLS (default $FLYWHEEL_TLS_CERT_FILE)",
    )
    group.add_argument(
        "--tls-key",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="PEM private key of --tls-cert (default $FLYWHEEL_TLS_KEY_FILE)",
    )
    group.add_argument(
        "--tls-server-name",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help="name to expect in the server's certificate, when the target's host is not in it; implies TLS "
        "(default $FLYWHEEL_TLS_SERVER_NAME)",
    )
    group.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=argparse.SUPPRESS, help="per-call timeout (default 10)"
    )


def connection_hint(args: argparse.Namespace) -> str:
    """How to point the CLI at a stack, and where the address it tried came from."""
    service = service_of(args)
    if getattr(args, "target", None):
        source = "--target"
    elif os.environ.get(service.env):
        source = f"${service.env}"
    else:
        source = "the default"
    return (
        f"hint: {getattr(args, 'resolved_target', service.default)} came from {source}. Is the stack up "
        '(flywheel-stack up)? Point this shell at it with: eval "$(flywheel-stack env)", or pass '
        f"--target HOST:PORT (and --auth-token-file, --tls-ca for a remote {service.name})"
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def message_json(message: Message) -> dict[str, Any]:
    """A message as JSON-ready values with the proto's field names: 64-bit integers as numbers
    (protobuf's JSON writes them as strings) and integral doubles as ints (``plain_number``)."""
    out = json_format.MessageToDict(message, preserving_proto_field_name=True)
    _int64_numbers(message, out)
    return plain_number(out)  # type: ignore[no-any-return]


def _int64_numbers(message: Message, out: dict[str, Any]) -> None:
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in out:
            continue
        if field.type in _INT64 and not field.message_type:
            out[name] = [int(v) for v in out[name]] if isinstance(out[name], list) else int(out[name])
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.message_type.full_name.startswith("google.protobuf."):
                continue  # well-known types (Timestamp, Struct) have their own JSON forms
            value = getattr(message, name)
            if isinstance(out[name], list):
                for sub, sub_out in zip(value, out[name], strict=True):
                    _int64_numbers(sub, sub_out)
            else:
                _int64_numbers(value, out[name])
