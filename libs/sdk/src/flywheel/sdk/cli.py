"""``flywheel``: manage endpoints, evaluate policies, run optimizations and train policies
from the command line.

    flywheel endpoint apply endpoint.yaml [--dry-run]   # create, or update to match the file
    flywheel endpoint get support-bot [--json]          # arms, posteriors, incumbent
    flywheel endpoint list [--json]
    flywheel ope support-bot --arm large [--since 2025-01-01T00:00:00Z] [--json]
    flywheel init [--output optimization.yaml]         # ask questions, write a run config
    flywheel optimize optimization.yaml [--no-wait]    # run it: progress, best config, results
    flywheel runs list [--json] | show RUN_ID [--json] | download RUN_ID [--output DIR] | cancel RUN_ID
    flywheel train submit --kind dpo --dataset URI --base-model tiny [--dry-run | --wait]  # cli_train
    flywheel train list | show JOB_ID | cancel JOB_ID
    flywheel policies list [--name N] | show POLICY_ID | promote POLICY_ID | rollback NAME  # cli_policies

The endpoint file's schema is documented in ``flywheel.sdk.endpoint_file`` (and
``libs/sdk/examples/endpoint.yaml``). The optimizer is ``--target`` or
``$FLYWHEEL_OPTIMIZER_ADDRESS`` (default 127.0.0.1:50051), the trainer (``train``,
``policies``) ``--target`` or ``$FLYWHEEL_TRAINER_ADDRESS`` (default 127.0.0.1:50056); the bearer token is
``$FLYWHEEL_AUTH_TOKEN`` or the contents of ``--auth-token-file`` (never a flag value, so
it stays out of process listings). TLS is on with any of ``--tls-ca``, ``--tls-cert`` and
``--tls-key`` (mTLS) or ``--tls-server-name``, or their ``$FLYWHEEL_TLS_CA_FILE``,
``$FLYWHEEL_TLS_CERT_FILE``, ``$FLYWHEEL_TLS_KEY_FILE``, ``$FLYWHEEL_TLS_SERVER_NAME``.
Errors are one line on stderr and exit code 1; a service that cannot be reached adds a
``hint:`` line saying how to point the CLI at the stack (``eval "$(flywheel-stack env)"``).
A closed stdout (``flywheel runs list | head``) ends the command quietly with exit code 141,
as a program killed by SIGPIPE would (what ``set -o pipefail`` scripts expect).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import runs_pb2 as runs_pb
from flywheel.api.values import plain_number
from flywheel.sdk.admin import AdminClient, ApplyConflict, apply_plan, plan_apply
from flywheel.sdk.cli_common import (
    OPTIMIZER,
    CliError,
    connection,
    connection_hint,
    connection_options,
    message_json,
    one_line,
    service_of,
    table,
)
from flywheel.sdk.cli_policies import add_parsers as add_policies_parsers
from flywheel.sdk.cli_train import add_parsers as add_train_parsers
from flywheel.sdk.endpoint_file import (
    ALLOCATION_FROM_PB,
    KIND_FROM_PB,
    STATUS_NAMES,
    EndpointFileError,
    load_endpoint_file,
)
from flywheel.sdk.run_init import (
    KINDS,
    METRICS,
    InitAnswers,
    ask_answers,
    parse_max_tokens,
    parse_range,
    render_config,
    write_example_cases,
)
from flywheel.sdk.runs import (
    ARTIFACT_NAMES,
    STATE_FROM_NAME,
    STATE_NAMES,
    TERMINAL_STATES,
    RunsClient,
    load_run_file,
)

DEFAULT_TARGET = OPTIMIZER.default
_ESTIMATOR_NAMES = {
    ope_pb.ESTIMATOR_IPS: "IPS",
    ope_pb.ESTIMATOR_SNIPS: "SNIPS",
    ope_pb.ESTIMATOR_DOUBLY_ROBUST: "DR",
}


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


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(**connection(args))


def _runs(args: argparse.Namespace) -> RunsClient:
    return RunsClient(**connection(args))


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
    return message_json(ep)  # pulls and other int64 counters as numbers, not strings


def cmd_get(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        ep = admin.get(args.name)
    if args.json:
        print(json.dumps(_endpoint_json(ep), indent=2, sort_keys=True))
        return 0
    print(f"endpoint     {ep.name}" + (f" - {ep.description}" if ep.description else ""))
    policy = ep.policy
    allocation = ALLOCATION_FROM_PB.get(policy.allocation, str(policy.allocation))
    knobs = [
        f"{k} {v}"
        for k, v in (
            ("exploration_floor", policy.exploration_floor),
            ("half_life_s", policy.half_life_s),
            ("window_s", policy.window_s),
            ("half_life_decisions", policy.half_life_decisions),
            ("window_decisions", policy.window_decisions),
            ("segment_key", policy.segment_key),
            ("sticky_ttl_s", policy.sticky_ttl_s if policy.sticky_sessions else 0),
            ("context_features", ",".join(policy.context_features)),
            ("allocation", "" if allocation == "thompson" else allocation),
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
        described = "the endpoint's policy (Thompson sampling or IDS) on the current posteriors"
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


# ---- runs: init, optimize, runs list/show/download -------------------------------------

_WATCH_RETRIES = 6  # reconnects while the optimizer restarts (a run survives it) before giving up
_WATCH_BACKOFF_S = 0.25  # doubles per failed try, at most 8 s


def _state(state: int) -> str:
    return STATE_NAMES.get(state, str(state))  # type: ignore[call-overload]


def _run_json(run: runs_pb.Run) -> dict[str, Any]:
    return plain_number(json_format.MessageToDict(run, preserving_proto_field_name=True))


def _created(run: runs_pb.Run) -> str:
    if not run.HasField("created_at"):
        return "-"
    return run.created_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")


def _api_name(run: runs_pb.Run) -> str:
    api = json_format.MessageToDict(run.config).get("api")
    return str(api.get("name", "-")) if isinstance(api, dict) else "-"


def _artifact_lines(run: runs_pb.Run) -> list[str]:
    names = [n for n in ARTIFACT_NAMES if n in run.artifacts] + sorted(set(run.artifacts) - set(ARTIFACT_NAMES))
    width = max(len(n) for n in names)
    return [f"  {n.ljust(width)}  {run.artifacts[n]}" for n in names]


def _print_result(run: runs_pb.Run) -> None:
    if run.state == runs_pb.RUN_STATE_FAILED:
        # a failed run's "best" is noise (every candidate scored 0 on errors): no best config
        print(f"run {run.run_id} failed after {run.generation}/{run.generations_total} generations")
        _print_failures(run)
        if run.artifacts:
            print("results:")
            print("\n".join(_artifact_lines(run)))
    else:
        print(
            f"run {run.run_id} {_state(run.state)} after {run.generation}/{run.generations_total} generations: "
            f"best score {run.best_score:.4f}"
        )
        _print_failures(run)
        _print_best_and_results(run)
    if run.artifacts:
        print(f"download them with: flywheel runs download {run.run_id}")


def _print_failures(run: runs_pb.Run, indent: str = "") -> None:
    """'N of M evaluations failed (T timed out)' and the most common errors, when any failed."""
    if not run.evaluations_failed:
        return
    print(
        f"{indent}{run.evaluations_failed} of {run.evaluations_done} evaluations failed"
        f" ({run.evaluations_timed_out} timed out)"
    )
    for e in run.top_errors[:3]:
        print(f"{indent}  {e.count} x {one_line(e.message)}")


def _print_warnings(run: runs_pb.Run) -> None:
    for w in run.warnings:
        print(f"warning: {w}", file=sys.stderr)


def _print_best_and_results(run: runs_pb.Run) -> None:
    if run.HasField("best_config"):
        print("best config:")
        print(json.dumps(plain_number(json_format.MessageToDict(run.best_config)), indent=2, sort_keys=True))
    if run.artifacts:
        print("results:")
        print("\n".join(_artifact_lines(run)))


def _confirm(args: argparse.Namespace, question: str, default: bool) -> bool:
    """A yes/no question; with --non-interactive the answer is no."""
    if args.non_interactive:
        return False
    reply = input(question).strip().lower()
    return default if not reply else reply in ("y", "yes")


def cmd_init(args: argparse.Namespace) -> int:
    out = Path(args.output)
    try:
        if args.non_interactive:
            answers = InitAnswers(
                name=args.name,
                kind=args.kind,
                model=args.model,
                api_base=args.api_base,
                key_env=args.key_env,
                max_tokens=args.max_tokens,
                endpoint=args.endpoint or "",
                callable=args.callable or "",
                temperature=args.temperature,
                system_prompts=args.system_prompt or InitAnswers().system_prompts,
                test_cases=args.test_cases,
                metrics=[m.strip() for m in args.metrics.split(",") if m.strip()],
                population=args.population,
                generations=args.generations,
            )
        else:
            answers = ask_answers()
        text = render_config(answers)
        if out.exists() and not args.force and not _confirm(args, f"{out} exists; overwrite it? [y/N] ", False):
            raise CliError(f"{out} exists; pass --force to overwrite it")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
        cases = out.parent / answers.test_cases
        if not cases.exists():
            if args.example_cases or _confirm(args, f"{cases} does not exist; write an example to edit? [Y/n] ", True):
                write_example_cases(cases)
                print(f"wrote {cases} (3 example cases: replace them with yours)")
            else:
                print(f"note: create {cases} before running (a JSON list of {{id, input, expected}})")
    except EOFError:
        raise CliError("stdin closed before all questions were answered; use --non-interactive with flags") from None
    print(f"run it with: flywheel optimize {out}")
    return 0


def _failed_count(message: runs_pb.Run | runs_pb.RunProgress) -> int:
    """How many of the run's evaluations have failed so far."""
    return int(message.evaluations_failed)


def _finish_bar(bar: Any, run: runs_pb.Run, last: runs_pb.RunProgress | None, log: Any) -> None:
    """Close the bar as the run ended: at 100% on success, with the evaluations that failed."""
    done = last.evaluations_done if last is not None else int(bar.n)
    failed = _failed_count(run) or (_failed_count(last) if last is not None else 0)
    if run.state == runs_pb.RUN_STATE_SUCCEEDED:
        budget = int(bar.total or 0)
        # The total is the run's budget; racing drops losing candidates after a few cases and
        # patience may stop the search early, so a finished run usually needs fewer.
        bar.total = bar.n = done
        if budget > done:
            bar.write(
                f"done: {done} evaluations ({budget - done} of the {budget} budgeted were not needed: racing "
                "dropped clearly worse candidates early, or the search converged)",
                file=log,
            )
    else:
        bar.n = done
    if failed:
        bar.set_postfix_str(f"{failed} failed", refresh=False)
        bar.write(f"{failed} of {done} evaluations failed; see: flywheel runs show {run.run_id}", file=log)
    bar.refresh()


def _follow(runs: RunsClient, run_id: str, *, log: Any) -> runs_pb.Run:
    """Show WatchRun progress until the run ends; reconnect while the optimizer is unavailable."""
    from tqdm import tqdm  # lazily: only this command draws bars

    bar = tqdm(total=None, unit="eval", desc=f"run {run_id}", file=sys.stderr, dynamic_ncols=True)
    last_generation = 0
    failures = 0
    last: runs_pb.RunProgress | None = None
    try:
        while True:
            try:
                for p in runs.watch(run_id):
                    failures = 0
                    last = p
                    if p.evaluations_total and bar.total != p.evaluations_total:
                        bar.total = p.evaluations_total
                    bar.n = p.evaluations_done
                    failed = _failed_count(p)
                    if failed:
                        bar.set_postfix_str(f"{failed} failed", refresh=False)
                    bar.refresh()
                    if p.generation > last_generation:
                        last_generation = p.generation
                        bar.write(
                            f"generation {p.generation}/{p.generations_total}: best score {p.best_score:.4f} "
                            f"({p.evaluations_done} evaluations" + (f", {failed} failed)" if failed else ")"),
                            file=log,
                        )
                    if p.state in TERMINAL_STATES:
                        break
                run = runs.get(run_id)
                if run.state in TERMINAL_STATES:
                    _finish_bar(bar, run, last, log)
                    return run
                failures += 1  # the stream ended while the run goes on: the server closed it
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or failures >= _WATCH_RETRIES:  # type: ignore[attr-defined]
                    raise
                failures += 1
                bar.write(f"lost the optimizer ({one_line(exc.details() or '')}); reconnecting", file=sys.stderr)  # type: ignore[attr-defined]
            if failures > _WATCH_RETRIES:
                raise CliError(
                    f"the progress stream keeps ending while run {run_id} goes on; see: flywheel runs show {run_id}"
                )
            time.sleep(min(_WATCH_BACKOFF_S * 2**failures, 8.0))
    finally:
        bar.close()


def _interrupted(runs: RunsClient, run_id: str, cancel: bool) -> int:
    if not cancel:
        try:
            cancel = input(f"\ncancel run {run_id} on the optimizer? [y/N] ").strip().lower() in ("y", "yes")
        except (EOFError, KeyboardInterrupt):
            cancel = False
    if cancel:
        run = runs.cancel(run_id)
        print(f"run {run_id}: {_state(run.state)}", file=sys.stderr)
    else:
        print(f"run {run_id} goes on; see it with: flywheel runs show {run_id}", file=sys.stderr)
    return 130


def cmd_optimize(args: argparse.Namespace) -> int:
    config = load_run_file(args.file)
    if args.name:
        api = config.get("api")
        config["api"] = {**api, "name": args.name} if isinstance(api, dict) else {"name": args.name}
    log = sys.stderr if args.json else sys.stdout  # --json keeps stdout for the JSON
    with _runs(args) as runs:
        run = runs.start(config)
        _print_warnings(run)  # config fields read but not acted on: never silence
        if args.no_wait:
            if args.json:
                print(json.dumps(_run_json(run), indent=2, sort_keys=True))
            else:
                print(f"run {run.run_id} {_state(run.state)}; follow it with: flywheel runs show {run.run_id}")
            return 0
        print(f"run {run.run_id} {_state(run.state)} (Ctrl-C to stop watching)", file=log)
        try:
            run = _follow(runs, run.run_id, log=log)
        except KeyboardInterrupt:
            return _interrupted(runs, run.run_id, args.cancel_on_interrupt)
    if args.json:
        print(json.dumps(_run_json(run), indent=2, sort_keys=True))
    else:
        _print_result(run)
    if run.state == runs_pb.RUN_STATE_FAILED:
        raise CliError(f"run {run.run_id} failed: {run.error or 'no reason given'}")
    if run.state == runs_pb.RUN_STATE_CANCELLED:
        raise CliError(f"run {run.run_id} was cancelled")
    return 0


def cmd_runs_list(args: argparse.Namespace) -> int:
    state = STATE_FROM_NAME[args.state] if args.state else runs_pb.RUN_STATE_UNSPECIFIED
    with _runs(args) as runs:
        found = runs.list(limit=args.limit, state=state)
    if args.json:
        print(json.dumps([_run_json(r) for r in found], indent=2, sort_keys=True))
        return 0
    if not found:
        print("no runs")
        return 0
    rows = [
        [
            r.run_id,
            _state(r.state),
            _api_name(r),
            f"{r.generation}/{r.generations_total}",
            f"{r.best_score:.4f}" if r.generation else "-",
            _created(r),
        ]
        for r in found
    ]
    print(table(["RUN_ID", "STATE", "API", "GENERATION", "BEST", "CREATED"], rows))
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    with _runs(args) as runs:
        run = runs.get(args.run_id)
    if args.json:
        print(json.dumps(_run_json(run), indent=2, sort_keys=True))
        return 0
    print(f"run          {run.run_id}")
    print(f"state        {_state(run.state)}")
    print(f"api          {_api_name(run)}")
    print(f"created      {_created(run)}")
    print(f"generation   {run.generation}/{run.generations_total}")
    print(f"best score   {run.best_score:.4f}" if run.generation else "best score   -")
    if run.error:
        print(f"error        {one_line(run.error)}")
    print(f"evaluations  {run.evaluations_done} of {run.evaluations_total}")
    if run.evaluations_failed:
        print("failed", end="")
        _print_failures(run, indent="       ")
    for w in run.warnings:
        print(f"warning      {w}")
    _print_best_and_results(run)
    return 0


def cmd_runs_candidates(args: argparse.Namespace) -> int:
    with _runs(args) as runs:
        found = runs.candidates(args.run_id, min_generation=args.min_generation)
    if args.json:
        listed = [
            {
                "candidate_id": c.candidate_id,
                "generation": c.generation,
                "config": plain_number(json_format.MessageToDict(c.config)),
                "origin": c.origin,
                "mean_score": c.mean_score,
                "cases_evaluated": c.cases_evaluated,
                "cases_failed": c.cases_failed,
            }
            for c in found.candidates
        ]
        print(json.dumps({"generation": found.generation, "candidates": listed}, indent=2, sort_keys=True))
        return 0
    if not found.candidates:
        print(f"no candidates (run generation {found.generation})")
        return 0
    rows = [
        [
            c.candidate_id,
            str(c.generation),
            c.origin,
            f"{c.mean_score:.4f}" if c.cases_evaluated else "-",
            str(c.cases_evaluated),
            str(c.cases_failed),
            json.dumps(plain_number(json_format.MessageToDict(c.config)), sort_keys=True),
        ]
        for c in found.candidates
    ]
    print(table(["CANDIDATE", "GEN", "ORIGIN", "MEAN", "CASES", "FAILED", "CONFIG"], rows))
    return 0


def cmd_runs_download(args: argparse.Namespace) -> int:
    out = Path(args.output or args.run_id)
    missing: list[str] = []
    with _runs(args) as runs:
        run = runs.get(args.run_id)  # NOT_FOUND here says the run does not exist
        for name in ARTIFACT_NAMES:
            try:
                artifact = runs.artifact(args.run_id, name)
            except grpc.RpcError as exc:
                # the optimizer answers FAILED_PRECONDITION for a file not written yet
                if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):  # type: ignore[attr-defined]
                    raise
                missing.append(name)
                continue
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(artifact.content)  # our name, never the server's: no path tricks
            print(f"wrote {out / name} ({len(artifact.content)} bytes)")
    if missing:
        why = "" if run.state in TERMINAL_STATES else "; results are written when the run ends"
        raise CliError(f"run {run.run_id} ({_state(run.state)}) has no {', '.join(missing)}{why}")
    return 0


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    with _runs(args) as runs:
        run = runs.cancel(args.run_id)
    if run.state != runs_pb.RUN_STATE_CANCELLED:
        raise CliError(f"run {run.run_id} is {_state(run.state)}: only a running run can be cancelled")
    print(f"run {run.run_id} cancelled after {run.generation}/{run.generations_total} generations")
    return 0


# ---- parser ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flywheel",
        description="Manage Flywheel endpoints, evaluate policies offline, run batch optimizations, "
        "train policies and manage their versions.",
        epilog="Errors are printed as one line on stderr with exit code 1.",
    )
    connection_options(parser, None)
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
    connection_options(apply)
    apply.set_defaults(func=cmd_apply)

    get = ep_commands.add_parser("get", help="show an endpoint's arms, posteriors and incumbent")
    get.add_argument("name")
    get.add_argument("--json", action="store_true", help="print the endpoint as JSON")
    connection_options(get)
    get.set_defaults(func=cmd_get)

    lst = ep_commands.add_parser("list", help="list endpoints")
    lst.add_argument("--json", action="store_true", help="print the endpoints as JSON")
    connection_options(lst)
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
    which.add_argument(
        "--current",
        action="store_true",
        help="the endpoint's policy (Thompson sampling or IDS) on the current posteriors",
    )
    ope.add_argument("--since", type=iso_time, metavar="ISO", help="decisions at or after this time (UTC if no zone)")
    ope.add_argument("--until", type=iso_time, metavar="ISO", help="decisions before this time (UTC if no zone)")
    ope.add_argument("--confidence", type=confidence, default=0.95, help="interval confidence level (default 0.95)")
    ope.add_argument("--json", action="store_true", help="print the result as JSON")
    connection_options(ope)
    ope.set_defaults(func=cmd_ope)
    _run_parsers(commands)
    add_train_parsers(commands)
    add_policies_parsers(commands)
    return parser


def _run_parsers(commands: Any) -> None:
    defaults = InitAnswers()
    init = commands.add_parser(
        "init",
        help="write a run config for flywheel optimize, asking a few questions",
        description="Ask for the API, the parameters to search and the metrics, and write a commented "
        "run config (the schema of services/optimizer/examples/capitals/optimization.yaml). With "
        "--non-interactive nothing is asked and the flags below (or their defaults) are used.",
    )
    init.add_argument("--output", "-o", default="optimization.yaml", help="file to write (default optimization.yaml)")
    init.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    init.add_argument("--non-interactive", action="store_true", help="ask nothing; use the flags")
    init.add_argument("--example-cases", action="store_true", help="write an example test-case file if missing")
    answers = init.add_argument_group("answers (with --non-interactive)")
    answers.add_argument("--name", default=defaults.name, help=f"API name (default {defaults.name})")
    answers.add_argument("--kind", choices=KINDS, default=defaults.kind, help="target kind (default llm)")
    answers.add_argument("--model", default=defaults.model, help=f"LiteLLM model (default {defaults.model})")
    answers.add_argument(
        "--api-base",
        default=defaults.api_base,
        help=f"API base URL; empty for the provider's own API (default {defaults.api_base}, the local model server)",
    )
    answers.add_argument(
        "--key-env",
        default=defaults.key_env,
        metavar="NAME",
        help="the evaluator's environment variable holding the API key (needed without --api-base)",
    )
    answers.add_argument(
        "--max-tokens",
        type=_max_tokens,
        default=defaults.max_tokens,
        metavar="N[,N...]",
        help=f"max_tokens of an llm target; several values are searched (default {defaults.max_tokens[0]})",
    )
    answers.add_argument("--endpoint", help="URL of an http target")
    answers.add_argument("--callable", help="package.module:function of a python target")
    answers.add_argument(
        "--temperature", type=_range, default=defaults.temperature, metavar="MIN,MAX", help="default 0.0,1.0"
    )
    answers.add_argument("--system-prompt", action="append", metavar="TEXT", help="a prompt to try (repeat)")
    answers.add_argument("--test-cases", default=defaults.test_cases, help="test-case file, relative to the config")
    answers.add_argument(
        "--metrics", default=",".join(defaults.metrics), help=f"comma-separated, from {', '.join(METRICS)}"
    )
    answers.add_argument("--population", type=int, default=defaults.population, help="configs per generation")
    answers.add_argument("--generations", type=int, default=defaults.generations, help="number of generations")
    init.set_defaults(func=cmd_init)

    optimize = commands.add_parser(
        "optimize",
        help="start an optimization run and follow it to the best config",
        description="Send the run config (test cases inlined from their file) to the optimizer, show "
        "progress per generation, then print the best config and where the reports are. Ctrl-C asks "
        "whether to cancel the run. Exit code 1 if the run fails or is cancelled.",
    )
    optimize.add_argument("file", metavar="CONFIG.yaml")
    optimize.add_argument("--name", help="override api.name of the config")
    optimize.add_argument("--no-wait", action="store_true", help="print the run id and return")
    optimize.add_argument("--json", action="store_true", help="print the finished run as JSON (progress on stderr)")
    optimize.add_argument("--cancel-on-interrupt", action="store_true", help="Ctrl-C cancels the run without asking")
    connection_options(optimize)
    optimize.set_defaults(func=cmd_optimize)

    runs = commands.add_parser("runs", help="list, inspect, download and cancel optimization runs")
    run_commands = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    lst = run_commands.add_parser("list", help="list runs, newest first")
    lst.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    lst.add_argument("--state", choices=sorted(STATE_FROM_NAME), help="only runs in this state")
    lst.add_argument("--json", action="store_true", help="print the runs as JSON")
    connection_options(lst)
    lst.set_defaults(func=cmd_runs_list)
    show = run_commands.add_parser("show", help="a run's state, best config and result files")
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="print the run as JSON")
    connection_options(show)
    show.set_defaults(func=cmd_runs_show)
    candidates = run_commands.add_parser(
        "candidates",
        help="every config a run evaluated, with its mean score so far",
        description="A run's history: each candidate config by generation, who proposed it (search, rlp, "
        "external...), its mean score over the test cases evaluated so far (a failed case scores 0), cases "
        "evaluated and failed. At most 10,000 candidates (the newest generations); use --min-generation for "
        "the rest.",
    )
    candidates.add_argument("run_id", metavar="RUN_ID")
    candidates.add_argument("--min-generation", type=int, default=0, help="only generations from this one on")
    candidates.add_argument("--json", action="store_true", help="print the candidates as JSON")
    connection_options(candidates)
    candidates.set_defaults(func=cmd_runs_candidates)
    download = run_commands.add_parser("download", help=f"write a run's result files ({', '.join(ARTIFACT_NAMES)})")
    download.add_argument("run_id", metavar="RUN_ID")
    download.add_argument("--output", "-o", metavar="DIR", help="folder to write to (default ./RUN_ID)")
    connection_options(download)
    download.set_defaults(func=cmd_runs_download)
    cancel = run_commands.add_parser(
        "cancel",
        help="stop a running run",
        description="Stop a running run on the optimizer (evaluations already queued are answered and "
        "ignored). Exit code 1 if the run is not running (pending, or already ended).",
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    connection_options(cancel)
    cancel.set_defaults(func=cmd_runs_cancel)


def _range(text: str) -> tuple[float, float]:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _max_tokens(text: str) -> list[int]:
    try:
        return parse_max_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# Exit code of a command whose reader went away: what a shell reports for death by SIGPIPE.
BROKEN_PIPE_EXIT = 141


def _stdout_gone() -> int:
    """stdout's reader closed the pipe: send what is left to /dev/null (so the interpreter's final
    flush cannot raise again) and exit like a program killed by SIGPIPE, without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by something without a descriptor
        pass
    return BROKEN_PIPE_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        raw = (exc.details() or "").strip()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.INVALID_ARGUMENT and "\n" in raw:
            # a refused run config: one "field.path: problem" line per error, shown as sent
            first, *rest = raw.splitlines()
            print(f"error: {code.name}: {first}", file=sys.stderr)
            for line in rest:
                print(line, file=sys.stderr)
            return 1
        details = one_line(raw)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            details = f"{service_of(args).name} at {getattr(args, 'resolved_target', '?')}: {details}"
        print(f"error: {code.name}: {details}", file=sys.stderr)
        if code == grpc.StatusCode.UNAVAILABLE:
            print(connection_hint(args), file=sys.stderr)
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            print("hint: set $FLYWHEEL_AUTH_TOKEN or pass --auth-token-file FILE", file=sys.stderr)
    except EndpointFileError as exc:
        lines = str(exc).splitlines()
        print(f"error: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(line, file=sys.stderr)
    except (ApplyConflict, CliError, ValueError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
