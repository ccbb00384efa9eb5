"""``flywheel``: manage endpoints and evaluate policies from the command line.

    flywheel endpoint apply endpoint.yaml [--dry-run]   # create, or update to match the file
    flywheel endpoint get support-bot [--json]          # arms, posteriors, incumbent
    flywheel endpoint list [--json]
    flywheel ope support-bot --arm large [--since 2025-01-01T00:00:00Z] [--json]

The endpoint file's schema is documented in ``flywheel.sdk.endpoint_file`` (and
``libs/sdk/examples/endpoint.yaml``). The optimizer is ``--target`` or
``$FLYWHEEL_OPTIMIZER_ADDRESS`` (default 127.0.0.1:50051); the bearer token is
``$FLYWHEEL_AUTH_TOKEN`` or the contents of ``--auth-token-file`` (never a flag value, so
it stays out of process listings). Errors are one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.sdk.admin import AdminClient, ApplyConflict, apply_plan, plan_apply
from flywheel.sdk.endpoint_file import KIND_FROM_PB, STATUS_NAMES, EndpointFileError, load_endpoint_file

DEFAULT_TARGET = "127.0.0.1:50051"
_ESTIMATOR_NAMES = {
    ope_pb.ESTIMATOR_IPS: "IPS",
    ope_pb.ESTIMATOR_SNIPS: "SNIPS",
    ope_pb.ESTIMATOR_DOUBLY_ROBUST: "DR",
}


class CliError(Exception):
    """A problem to report as one line, exit code 1."""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


# ---- argument types -------------------------------------------------------------------


def iso_time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2025-01-31T12:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def distribution(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        arm, sep, prob = part.partition("=")
        try:
            if not sep or not arm.strip():
                raise ValueError
            out[arm.strip()] = float(prob)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not ARM=PROBABILITY (e.g. a=0.5,b=0.5)") from None
    if not out:
        raise argparse.ArgumentTypeError("give at least one ARM=PROBABILITY")
    return out


def confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a confidence level in (0, 1), e.g. 0.95")
    return value


# ---- connection -----------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> AdminClient:
    target = getattr(args, "target", None) or os.environ.get("FLYWHEEL_OPTIMIZER_ADDRESS") or DEFAULT_TARGET
    args.resolved_target = target
    token = os.environ.get("FLYWHEEL_AUTH_TOKEN") or None
    token_file = getattr(args, "auth_token_file", None)
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--auth-token-file {token_file}: {exc.strerror or exc}") from None
    roots = None
    ca = getattr(args, "tls_ca", None)
    if ca is not None:
        try:
            roots = Path(ca).read_bytes()
        except OSError as exc:
            raise CliError(f"--tls-ca {ca}: {exc.strerror or exc}") from None
    return AdminClient(
        target=target, auth_token=token, tls_root_certificates=roots, timeout_s=getattr(args, "timeout", None) or 10.0
    )


# ---- commands -------------------------------------------------------------------------


def cmd_apply(args: argparse.Namespace) -> int:
    file = load_endpoint_file(args.file)
    with _admin(args) as admin:
        plan = plan_apply(file, admin.find(file.name))
        for note in plan.notes:
            print(f"note: {note}")
        if plan.conflicts:
            raise ApplyConflict("; ".join(plan.conflicts))
        if plan.empty:
            print(f"endpoint {file.name!r}: no changes")
            return 0
        if args.dry_run:
            print(f"endpoint {file.name!r}: plan (dry run, nothing changed):")
            for line in plan.describe():
                print(f"  {line}")
            return 0
        apply_plan(admin, plan, echo=print)
        n = 1 if plan.create else len(plan.add) + len(plan.retire) + (1 if plan.settings else 0)
        print(f"endpoint {file.name!r}: applied {n} change{'s' if n != 1 else ''}")
    return 0


def _endpoint_json(ep: pb.Endpoint) -> dict[str, Any]:
    return json_format.MessageToDict(ep, preserving_proto_field_name=True)


def cmd_get(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        ep = admin.get(args.name)
    if args.json:
        print(json.dumps(_endpoint_json(ep), indent=2, sort_keys=True))
        return 0
    print(f"endpoint     {ep.name}" + (f" - {ep.description}" if ep.description else ""))
    policy = ep.policy
    knobs = [
        f"{k} {v}"
        for k, v in (
            ("exploration_floor", policy.exploration_floor),
            ("half_life_s", policy.half_life_s),
            ("window_s", policy.window_s),
            ("segment_key", policy.segment_key),
            ("sticky_ttl_s", policy.sticky_ttl_s if policy.sticky_sessions else 0),
            ("context_features", ",".join(policy.context_features)),
        )
        if v
    ]
    print(f"policy       {KIND_FROM_PB.get(policy.kind, policy.kind)}" + (f" ({', '.join(knobs)})" if knobs else ""))
    weights = dict(ep.reward_spec.signal_weights)
    print(
        f"reward       {'bounded [0, 1]' if ep.reward_spec.bounded else 'unbounded'}"
        + (f", signal weights {json.dumps(weights, sort_keys=True)}" if weights else "")
    )
    print(f"incumbent    {ep.incumbent_arm_id or '(none yet)'}")
    stats = {s.arm_id: s for s in ep.stats}
    rows = []
    for arm in ep.arms:
        s = stats.get(arm.arm_id, pb.ArmStats())
        status = STATUS_NAMES.get(arm.status, "?")
        if arm.status == pb.ARM_STATUS_CANARY:
            status += f" (cap {arm.traffic_cap:g})"
        rows.append(
            [
                arm.arm_id,
                status,
                s.pulls,
                _f(s.mean),
                f"[{_f(s.ci_low)}, {_f(s.ci_high)}]",
                _f(s.selection_probability),
                _f(s.probability_best),
                "*" if arm.arm_id == ep.incumbent_arm_id else "",
            ]
        )
    print()
    print(table(["ARM", "STATUS", "PULLS", "MEAN", "95% INTERVAL", "P(SELECT)", "P(BEST)", "INCUMBENT"], rows))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        endpoints = admin.list()
    if args.json:
        print(json.dumps([_endpoint_json(ep) for ep in endpoints], indent=2, sort_keys=True))
        return 0
    if not endpoints:
        print("no endpoints")
        return 0
    rows = []
    for ep in endpoints:
        live = sum(a.status != pb.ARM_STATUS_RETIRED for a in ep.arms)
        retired = len(ep.arms) - live
        rows.append(
            [
                ep.name,
                KIND_FROM_PB.get(ep.policy.kind, ep.policy.kind),
                f"{live}" + (f" (+{retired} retired)" if retired else ""),
                sum(s.pulls for s in ep.stats),
                ep.incumbent_arm_id or "-",
                ep.description,
            ]
        )
    print(table(["NAME", "POLICY", "ARMS", "PULLS", "INCUMBENT", "DESCRIPTION"], rows))
    return 0


def cmd_ope(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        resp = admin.estimate(
            args.endpoint,
            arm_id=args.arm,
            distribution=args.distribution,
            current_posterior=args.current,
            since=args.since,
            until=args.until,
            confidence=args.confidence,
        )
    if args.arm is not None:
        candidate: Any = {"arm_id": args.arm}
        described = f"always arm {args.arm!r}"
    elif args.distribution is not None:
        candidate = {"distribution": args.distribution}
        described = "fixed distribution " + ", ".join(f"{a}={p:g}" for a, p in args.distribution.items())
    else:
        candidate = {"current_posterior": True}
        described = "Thompson sampling from the current posteriors"
    estimates = [
        {
            "estimator": _ESTIMATOR_NAMES.get(e.estimator, str(e.estimator)).lower(),
            "value": e.value,
            "ci_low": e.ci_low,
            "ci_high": e.ci_high,
        }
        for e in resp.estimates
    ]
    if args.json:
        out = {
            "endpoint": args.endpoint,
            "candidate": candidate,
            "confidence": args.confidence,
            "since": args.since.isoformat() if args.since else None,
            "until": args.until.isoformat() if args.until else None,
            "samples": resp.samples,
            "logged_value": resp.logged_value,
            "effective_sample_size": resp.effective_sample_size,
            "estimates": estimates,
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"endpoint {args.endpoint}: {described}")
    print(
        f"samples {resp.samples}   logged value {_f(resp.logged_value, 4)}   "
        f"effective sample size {resp.effective_sample_size:.1f}"
    )
    level = f"{args.confidence * 100:g}% INTERVAL"
    rows = [
        [e["estimator"].upper(), _f(e["value"], 4), f"[{_f(e['ci_low'], 4)}, {_f(e['ci_high'], 4)}]"] for e in estimates
    ]
    print(table(["ESTIMATOR", "VALUE", level], rows))
    if resp.samples and resp.effective_sample_size < 0.1 * resp.samples:
        print("warning: effective sample size is under 10% of the samples; the estimates are unreliable")
    return 0


# ---- parser ---------------------------------------------------------------------------


def _connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--target",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help=f"optimizer gRPC address (default $FLYWHEEL_OPTIMIZER_ADDRESS or {DEFAULT_TARGET})",
    )
    group.add_argument(
        "--auth-token-file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="file holding the bearer token (default $FLYWHEEL_AUTH_TOKEN)",
    )
    group.add_argument(
        "--tls-ca", metavar="FILE", default=argparse.SUPPRESS, help="PEM root certificates: connect with TLS"
    )
    group.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=argparse.SUPPRESS, help="per-call timeout (default 10)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flywheel",
        description="Manage Flywheel endpoints and evaluate policies offline.",
        epilog="Errors are printed as one line on stderr with exit code 1.",
    )
    _connection_options(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    endpoint = commands.add_parser("endpoint", help="create, update and inspect endpoints")
    ep_commands = endpoint.add_subparsers(dest="endpoint_command", required=True, metavar="ACTION")

    apply = ep_commands.add_parser(
        "apply",
        help="create the endpoint of a YAML file, or update it to match",
        description="Create the endpoint if missing; otherwise update description, policy and reward, add "
        "the arms in the file that are not live and retire live arms missing from the file. Each "
        "change is printed; applying the same file again changes nothing. Schema: "
        "flywheel.sdk.endpoint_file (libs/sdk/examples/endpoint.yaml).",
    )
    apply.add_argument("file", metavar="FILE.yaml")
    apply.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    _connection_options(apply)
    apply.set_defaults(func=cmd_apply)

    get = ep_commands.add_parser("get", help="show an endpoint's arms, posteriors and incumbent")
    get.add_argument("name")
    get.add_argument("--json", action="store_true", help="print the endpoint as JSON")
    _connection_options(get)
    get.set_defaults(func=cmd_get)

    lst = ep_commands.add_parser("list", help="list endpoints")
    lst.add_argument("--json", action="store_true", help="print the endpoints as JSON")
    _connection_options(lst)
    lst.set_defaults(func=cmd_list)

    ope = commands.add_parser(
        "ope",
        help="off-policy evaluation of a candidate policy on the logged decisions",
        description="Estimate how a candidate policy would have done on the logged decisions that have "
        "feedback (IPS, SNIPS and doubly robust, with intervals).",
    )
    ope.add_argument("endpoint")
    which = ope.add_mutually_exclusive_group(required=True)
    which.add_argument("--arm", metavar="ARM", help="always choose this arm")
    which.add_argument(
        "--distribution", metavar="A=P,B=P", type=distribution, help="a fixed distribution over arms, e.g. a=0.5,b=0.5"
    )
    which.add_argument("--current", action="store_true", help="Thompson sampling from the current posteriors")
    ope.add_argument("--since", type=iso_time, metavar="ISO", help="decisions at or after this time (UTC if no zone)")
    ope.add_argument("--until", type=iso_time, metavar="ISO", help="decisions before this time (UTC if no zone)")
    ope.add_argument("--confidence", type=confidence, default=0.95, help="interval confidence level (default 0.95)")
    ope.add_argument("--json", action="store_true", help="print the result as JSON")
    _connection_options(ope)
    ope.set_defaults(func=cmd_ope)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        details = _one_line(exc.details() or "")  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            details = f"optimizer at {getattr(args, 'resolved_target', '?')}: {details}"
        print(f"error: {code.name}: {details}", file=sys.stderr)
    except EndpointFileError as exc:
        lines = str(exc).splitlines()
        print(f"error: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(line, file=sys.stderr)
    except (ApplyConflict, CliError, ValueError) as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
