"""``flywheel-stack up|down|status|env``: the local stack on loopback.

flywheel-stack up        # NATS, PostgreSQL, S3 and all six services; returns when SERVING
flywheel-stack status    # health of each service
flywheel-stack env       # export lines to point the SDK (--role product, the default) or a service at the stack
flywheel-stack down      # stop everything by pid
flywheel-stack nats-permissions [--namespace NS]   # the NATS users' allow-lists, as JSON for a chart's values
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from flywheel.api.subjects import ROLES
from flywheel.stack.servers import nats_users
from flywheel.stack.services import health_status
from flywheel.stack.stack import STATE_FILE, Stack


def default_root() -> Path:
    return Path(os.environ.get("FLYWHEEL_STACK_DIR", ".flywheel")).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flywheel-stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "env", "nats-permissions"])
    parser.add_argument("--dir", type=Path, default=None, help="data folder (default .flywheel or $FLYWHEEL_STACK_DIR)")
    parser.add_argument(
        "--role",
        default="product",
        choices=[r for r, spec in ROLES.items() if spec.uses_bus],
        help="env: whose NATS user to print (default product, what the SDK needs)",
    )
    parser.add_argument("--namespace", default="flywheel", help="nats-permissions: the namespace to allow")
    args = parser.parse_args(argv)
    root = (args.dir or default_root()).resolve()

    if args.command == "nats-permissions":
        print(json.dumps({"authorization": {"users": chart_users(args.namespace)}}, indent=2))
        return 0

    if args.command == "up":
        if (root / STATE_FILE).exists():
            print(f"a stack is already recorded in {root}; run `flywheel-stack down` first", file=sys.stderr)
            return 1
        stack = Stack.create(root)
        try:
            stack.up()
        except Exception:
            stack.down()
            raise
        for name, proc in stack.services.items():
            print(f"{name:13s} grpc {proc.address}  metrics http://127.0.0.1:{proc.metrics_port}/metrics")
        print(f"nats          {stack.servers.nats.url}\ns3            http://{stack.servers.s3.endpoint}")
        print(f"data and logs {root}")
        return 0

    if not (root / STATE_FILE).exists():
        print(f"no stack recorded in {root}", file=sys.stderr)
        return 0 if args.command == "down" else 1
    stack = Stack.load(root)
    if args.command == "down":
        stack.down()
        print("stack stopped")
    elif args.command == "status":
        for name, proc in stack.services.items():
            print(f"{name:13s} {proc.address:22s} {health_status(proc.address)}")
    else:
        for key, value in stack.servers.env(nats_role=args.role).items():
            print(f"export {key}={shlex.quote(value)}")
        print(f"export FLYWHEEL_OPTIMIZER_ADDRESS={stack.services['optimizer'].address}")
    return 0


def chart_users(namespace: str) -> list[dict[str, object]]:
    """``authorization.users`` for the nats Helm chart's ``config.merge``: every role's user
    with its allow-lists, and each password a ``<< $NATS_<ROLE>_PASSWORD >>`` reference that
    the chart fills from a Secret through the container's environment."""
    roles = [r for r, spec in ROLES.items() if spec.uses_bus]
    return nats_users({r: f"<< $NATS_{r.upper()}_PASSWORD >>" for r in roles}, namespace)


if __name__ == "__main__":
    sys.exit(main())
