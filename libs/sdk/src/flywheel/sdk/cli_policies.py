"""``flywheel policies``: the trainer's registry of policy versions.

    flywheel policies list [--name support-bot] [--json]
    flywheel policies show POLICY_ID [--json]        # status, lineage (parents), dataset, job, metrics
    flywheel policies promote POLICY_ID [--reason TEXT]
    flywheel policies rollback NAME [--reason TEXT]

Promote makes a version the active one of its name and retires the version that was active;
rollback marks the active version rolled back and makes the one active before it active
again. The registry refuses what its rules forbid (promoting a rolled-back version, rolling
back with nothing to return to) with FAILED_PRECONDITION naming the rule, printed as is.
Each change records ``--actor`` (default ``cli:$USER``) and ``--reason`` in the version's
status history.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import grpc

from flywheel.api.trainer.v1 import jobs_pb2 as pb
from flywheel.sdk.cli_common import TRAINER, connection, connection_options, message_json, table
from flywheel.sdk.cli_train import when
from flywheel.sdk.trainer import KIND_NAMES, POLICY_STATUS_NAMES, TrainerClient

_MAX_LINEAGE = 20  # parents followed by show; a longer chain ends with "..."


def _trainer(args: argparse.Namespace) -> TrainerClient:
    return TrainerClient(**connection(args))


def status_name(status: int) -> str:
    return POLICY_STATUS_NAMES.get(status, str(status))  # type: ignore[call-overload]


def policy_json(policy: pb.Policy) -> dict[str, Any]:
    return message_json(policy)


def _label(policy: pb.Policy) -> str:
    return f"{policy.name} v{policy.version} ({policy.policy_id})"


def _created(policy: pb.Policy) -> str:
    return when(policy.created_at, policy.HasField("created_at"))


def default_actor() -> str:
    return f"cli:{os.environ.get('USER') or os.environ.get('USERNAME') or 'unknown'}"


def cmd_list(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        policies = trainer.list_policies(args.name or "")
    if args.json:
        print(json.dumps([policy_json(p) for p in policies], indent=2, sort_keys=True))
        return 0
    if not policies:
        print(f"no versions of {args.name!r}" if args.name else "no policies")
        return 0
    rows = [
        [
            p.policy_id,
            p.name,
            p.version,
            status_name(p.status),
            KIND_NAMES.get(p.kind, str(p.kind)),
            p.base_model or "-",
            p.job_id or "-",
            _created(p),
        ]
        for p in policies
    ]
    print(table(["POLICY_ID", "NAME", "VERSION", "STATUS", "KIND", "BASE_MODEL", "JOB", "CREATED"], rows))
    return 0


def lineage(trainer: TrainerClient, policy: pb.Policy) -> list[pb.Policy | str]:
    """The version's parents, nearest first; a parent that no longer exists is its id (str)."""
    chain: list[pb.Policy | str] = []
    seen = {policy.policy_id}
    parent_id = policy.parent_policy_id
    while parent_id and len(chain) < _MAX_LINEAGE and parent_id not in seen:
        seen.add(parent_id)
        try:
            parent = trainer.get_policy(parent_id)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise
            chain.append(parent_id)
            break
        chain.append(parent)
        parent_id = parent.parent_policy_id
    return chain


def cmd_show(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        policy = trainer.get_policy(args.policy_id)
        parents = lineage(trainer, policy)
        active = [p for p in trainer.list_policies(policy.name) if p.status == pb.POLICY_STATUS_ACTIVE]
    if args.json:
        out = policy_json(policy)
        out["lineage"] = [policy_json(p) if isinstance(p, pb.Policy) else {"policy_id": p} for p in parents]
        out["active_version"] = policy_json(active[0]) if active else None
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    since = when(policy.updated_at, policy.HasField("updated_at"))
    lines = [
        ("policy", policy.policy_id),
        ("name", f"{policy.name} v{policy.version}"),
        ("status", f"{status_name(policy.status)} (since {since})"),
        (
            "active",
            "this version"
            if active and active[0].policy_id == policy.policy_id
            else (_label(active[0]) if active else "(no active version)"),
        ),
        ("kind", KIND_NAMES.get(policy.kind, str(policy.kind))),
        ("base model", policy.base_model or "-"),
        ("checkpoint", policy.checkpoint_uri or "-"),
        ("dataset", policy.dataset_uri or "-"),
        ("job", policy.job_id or "-"),
        ("created", _created(policy)),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}")
    if parents:
        print()
        rows: list[list[Any]] = [
            [
                "",
                policy.version,
                policy.policy_id,
                status_name(policy.status),
                policy.job_id or "-",
                policy.dataset_uri or "-",
            ]
        ]
        for p in parents:
            if isinstance(p, str):
                rows.append(["<-", "?", p, "(deleted)", "-", "-"])
            else:
                rows.append(
                    ["<-", p.version, p.policy_id, status_name(p.status), p.job_id or "-", p.dataset_uri or "-"]
                )
        if len(parents) == _MAX_LINEAGE and isinstance(parents[-1], pb.Policy) and parents[-1].parent_policy_id:
            rows.append(["<-", "...", parents[-1].parent_policy_id, "", "", ""])
        print(table(["LINEAGE", "VERSION", "POLICY_ID", "STATUS", "JOB", "DATASET"], rows))
    if policy.metrics:
        print()
        print(table(["METRIC", "VALUE"], [[k, f"{policy.metrics[k]:.4g}"] for k in sorted(policy.metrics)]))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        response = trainer.promote(args.policy_id, reason=args.reason, actor=args.actor)
    if args.json:
        retired = policy_json(response.retired) if response.HasField("retired") else None
        print(json.dumps({"policy": policy_json(response.policy), "retired": retired}, indent=2, sort_keys=True))
        return 0
    print(f"{_label(response.policy)} is active")
    if response.HasField("retired"):
        print(f"{_label(response.retired)} is retired; undo with: flywheel policies rollback {response.policy.name}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        response = trainer.rollback(args.name, reason=args.reason, actor=args.actor)
    if args.json:
        out = {"rolled_back": policy_json(response.rolled_back), "policy": policy_json(response.policy)}
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"{_label(response.rolled_back)} is rolled back")
    print(f"{_label(response.policy)} is active again")
    return 0


def add_parsers(commands: Any) -> None:
    """``flywheel policies ...`` under the CLI's top-level subcommands."""
    policies = commands.add_parser(
        "policies", help="list, inspect, promote and roll back policy versions (the trainer)"
    )
    actions = policies.add_subparsers(dest="policies_command", required=True, metavar="ACTION")

    lst = actions.add_parser("list", help="policy versions, newest first")
    lst.add_argument("--name", metavar="NAME", help="only the versions of this policy")
    lst.add_argument("--json", action="store_true", help="print the versions as JSON")
    connection_options(lst, TRAINER)
    lst.set_defaults(func=cmd_list)

    show = actions.add_parser("show", help="a version's status, lineage, dataset, job and metrics")
    show.add_argument("policy_id", metavar="POLICY_ID")
    show.add_argument("--json", action="store_true", help="print the version (with its lineage) as JSON")
    connection_options(show, TRAINER)
    show.set_defaults(func=cmd_show)

    promote = actions.add_parser(
        "promote",
        help="make a version the active one of its name",
        description="Make the version active; the version that was active is retired. Refused (exit "
        "code 1, the rule named) for a version that was rolled back or failed.",
    )
    promote.add_argument("policy_id", metavar="POLICY_ID")
    rollback = actions.add_parser(
        "rollback",
        help="roll the active version of a name back to the one before it",
        description="Mark the active version rolled back and make the version active before it "
        "active again. Refused (exit code 1, the rule named) when there is none to return to.",
    )
    rollback.add_argument("name", metavar="NAME")
    for parser, func in ((promote, cmd_promote), (rollback, cmd_rollback)):
        parser.add_argument("--reason", default="", help="why, kept in the status history")
        parser.add_argument(
            "--actor", default=default_actor(), help="who, kept in the status history (default cli:$USER)"
        )
        parser.add_argument("--json", action="store_true", help="print the changed versions as JSON")
        connection_options(parser, TRAINER)
        parser.set_defaults(func=func)
    for parser in (policies, lst, show, promote, rollback):
        parser.set_defaults(service=TRAINER)
