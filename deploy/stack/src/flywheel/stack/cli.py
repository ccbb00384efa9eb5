"""``flywheel-stack up|down|status|env``: the local stack on loopback.

flywheel-stack up        # NATS, PostgreSQL, S3 and all six services; returns when SERVING
flywheel-stack status    # health of each service
flywheel-stack env       # export lines to point the SDK (--role product, the default) or a service at the stack
flywheel-stack down      # stop everything by pid
flywheel-stack nats-permissions [--namespace NS]   # the NATS users' allow-lists, as JSON for a chart's values

Which stack. ``up`` puts it in ``--dir``, else ``$FLYWHEEL_STACK_DIR``, else ``./.flywheel``,
and records that folder in ``$XDG_STATE_HOME/flywheel/stack-dir`` (``~/.local/state/...``).
``env``, ``status`` and ``down`` work from any folder: they take ``--dir``, else
``$FLYWHEEL_STACK_DIR``, else the nearest ``.flywheel`` holding a stack in the current folder
or a parent, else the folder the last ``up`` recorded. So ``eval "$(flywheel-stack env)"``
points a shell anywhere at the stack started in the repository.
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
    """Where ``up`` puts a stack: ``$FLYWHEEL_STACK_DIR``, else ``./.flywheel``."""
    return Path(os.environ.get("FLYWHEEL_STACK_DIR", ".flywheel")).resolve()


def pointer_file() -> Path:
    """Where ``up`` records its folder, so the other commands find it from anywhere."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "flywheel" / "stack-dir"


def find_root() -> Path:
    """The stack ``env``/``status``/``down`` act on (see the module docstring for the order)."""
    if os.environ.get("FLYWHEEL_STACK_DIR"):
        return default_root()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / ".flywheel" / STATE_FILE).exists():
            return folder / ".flywheel"
    try:
        recorded = Path(pointer_file().read_text().strip())
    except OSError:
        return default_root()  # nothing recorded: report "no stack recorded in ./.flywheel"
    return recorded if recorded.is_absolute() else default_root()


def _record(root: Path) -> None:
    try:
        path = pointer_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{root}\n")
    except OSError as exc:  # a read-only home: the commands still work from the stack's folder
        print(f"note: could not record the stack's folder in {pointer_file()}: {exc.strerror}", file=sys.stderr)


def _forget(root: Path) -> None:
    try:
        if Path(pointer_file().read_text().strip()) == root:
            pointer_file().unlink()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flywheel-stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "env", "nats-permissions"])
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="data folder (default $FLYWHEEL_STACK_DIR; up: else ./.flywheel; the others: else the nearest "
        ".flywheel upwards, else the last up's)",
    )
    parser.add_argument(
        "--role",
        default="product",
        choices=[r for r, spec in ROLES.items() if spec.uses_bus],
        help="env: whose NATS user to print (default product, what the SDK needs)",
    )
    parser.add_argument("--namespace", default="flywheel", help="nats-permissions: the namespace to allow")
    args = parser.parse_args(argv)
    root = (args.dir or (default_root() if args.command == "up" else find_root())).resolve()

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
        _record(root)
        for name, proc in stack.services.items():
            print(f"{name:13s} grpc {proc.address}  metrics http://127.0.0.1:{proc.metrics_port}/metrics")
        print(f"nats          {stack.servers.nats.url}\ns3            http://{stack.servers.s3.endpoint}")
        print(f"data and logs {root}")
        return 0

    if not (root / STATE_FILE).exists():
        where = (
            ""
            if args.dir or os.environ.get("FLYWHEEL_STACK_DIR")
            else (f" (nor in a .flywheel above {Path.cwd()}, nor recorded by an `up` in {pointer_file()})")
        )
        print(f"no stack recorded in {root}{where}; start one with: flywheel-stack up", file=sys.stderr)
        return 0 if args.command == "down" else 1
    stack = Stack.load(root)
    if args.command == "down":
        stack.down()
        _forget(root)
        print("stack stopped")
    elif args.command == "status":
        for name, proc in stack.services.items():
            print(f"{name:13s} {proc.address:22s} {health_status(proc.address)}")
    else:
        for key, value in stack.servers.env(nats_role=args.role).items():
            print(f"export {key}={shlex.quote(value)}")
        print(f"export FLYWHEEL_OPTIMIZER_ADDRESS={stack.services['optimizer'].address}")
        if "trainer" in stack.services:  # flywheel train / policies
            print(f"export FLYWHEEL_TRAINER_ADDRESS={stack.services['trainer'].address}")
    return 0


def chart_users(namespace: str) -> list[dict[str, object]]:
    """``authorization.users`` for the nats Helm chart's ``config.merge``: every role's user
    with its allow-lists, and each password a ``<< $NATS_<ROLE>_PASSWORD >>`` reference that
    the chart fills from a Secret through the container's environment."""
    roles = [r for r, spec in ROLES.items() if spec.uses_bus]
    return nats_users({r: f"<< $NATS_{r.upper()}_PASSWORD >>" for r in roles}, namespace)


if __name__ == "__main__":
    sys.exit(main())
