"""``flywheel train``: submit training jobs to the trainer, follow them, list, show, cancel.

    flywheel train submit --kind dpo --dataset s3://exports/ds1/manifest.json --base-model tiny --wait
    flywheel train submit --kind grpo ... --reward judge:rubric=default --reward exact_match:answer:weight=0.5
    flywheel train submit ... --dry-run          # samples, score statistics, estimated steps/time/memory
    flywheel train list [--state running] [--limit N] [--json]
    flywheel train show JOB_ID [--json]
    flywheel train cancel JOB_ID

``--wait`` polls GetJob (step, total steps and metrics, which the trainer updates from each
progress event) behind a progress bar on stderr until the job ends, then prints the policy it
registered and its metrics; exit code 1 when the job failed or was cancelled. The reward,
metric and hyperparameter text forms are ``flywheel.sdk.trainer``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import UTC
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from flywheel.api.subjects import subject_token
from flywheel.api.trainer.v1 import jobs_pb2 as pb
from flywheel.api.values import plain_number
from flywheel.sdk.cli_common import (
    TRAINER,
    CliError,
    connection,
    connection_options,
    message_json,
    one_line,
    positive_int,
    table,
)
from flywheel.sdk.trainer import (
    JOB_STATE_FROM_NAME,
    JOB_STATE_NAMES,
    KIND_FROM_NAME,
    KIND_NAMES,
    ONLINE_KINDS,
    REWARD_FORMS,
    TERMINAL_JOB_STATES,
    TrainerClient,
    describe_reward,
    describe_verifiable,
    parse_hyperparameter,
    parse_reward,
    parse_verifiable,
)

_POLL_S = 2.0  # GetJob every this many seconds while waiting
_POLL_RETRIES = 6  # tries while the trainer is unavailable (a job survives a restart) before giving up
_POLL_BACKOFF_S = 0.25  # doubles per failed try, at most 8 s
# Metrics shown beside the bar, in this order, when the job reports them.
_BAR_METRICS = ("loss", "reward", "kl", "learning_rate", "tokens_per_s")


def _trainer(args: argparse.Namespace) -> TrainerClient:
    return TrainerClient(**connection(args))


def state_name(state: int) -> str:
    return JOB_STATE_NAMES.get(state, str(state))  # type: ignore[call-overload]


def job_json(job: pb.TrainingJob) -> dict[str, Any]:
    return message_json(job)


def when(ts: Timestamp, set_: bool) -> str:
    return ts.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds") if set_ else "-"


def _number(value: float) -> str:
    return f"{value:.4g}"


# ---- argument types -------------------------------------------------------------------


def _parsed(parse: Any) -> Any:
    """An argparse type from a parser that raises ValueError."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a dropout in [0, 1), e.g. 0.05")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share of traffic in (0, 1], e.g. 0.1")
    return value


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


# ---- submit ---------------------------------------------------------------------------


def build_spec(args: argparse.Namespace) -> pb.TrainingJobSpec:
    """The job spec of ``train submit``'s flags; what the flags cannot say together is a
    CliError naming the flag."""
    kind = KIND_FROM_NAME[args.kind]
    for flag, value in (("--dataset", args.dataset), ("--base-model", args.base_model)):
        if not value.strip():
            raise CliError(f"{flag} is empty")
    spec = pb.TrainingJobSpec(
        kind=kind,
        base_model=args.base_model,
        dataset_uri=args.dataset,
        endpoint=args.endpoint or "",
        parent_policy_id=args.parent or "",
    )
    if args.name:
        try:
            spec.policy_name = subject_token(args.name, what="--name")
        except ValueError as exc:
            raise CliError(str(exc)) from None
    lora = spec.lora
    lora.r, lora.alpha, lora.dropout = args.lora_r, args.lora_alpha, args.lora_dropout
    if args.lora_target_modules:
        lora.target_modules.extend(m.strip() for m in args.lora_target_modules.split(",") if m.strip())
    hyperparameters: dict[str, Any] = {}
    for key, value in args.hp or []:
        if key in hyperparameters:
            raise CliError(f"--hp {key} is given twice")
        hyperparameters[key] = value
    if hyperparameters:
        spec.hyperparameters.update(hyperparameters)
    rewards = args.reward or []
    if rewards and kind not in ONLINE_KINDS:
        raise CliError(f"--reward: only grpo and rloo take rewards, not {args.kind}")
    if kind in ONLINE_KINDS and not rewards:
        raise CliError(f"--kind {args.kind} needs at least one --reward ({REWARD_FORMS})")
    spec.rewards.extend(rewards)
    spec.eval_metrics.extend(args.eval_metric or [])
    if args.environment:
        if kind != pb.TRAINING_KIND_GRPO:
            raise CliError(f"--environment: only grpo trains over several turns, not {args.kind}")
        spec.multi_turn.environment = args.environment
        spec.multi_turn.max_turns = args.max_turns or 0
    elif args.max_turns:
        raise CliError("--max-turns needs --environment")
    if args.canary_cap is not None:
        if not args.endpoint:
            raise CliError("--canary-cap needs --endpoint (the endpoint whose canary arm the policy becomes)")
        spec.canary_traffic_cap = args.canary_cap
    return spec


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def print_dry_run(spec: pb.TrainingJobSpec, report: pb.DryRunReport) -> None:
    kind = KIND_NAMES.get(spec.kind, str(spec.kind))
    print(f"dry run of a {kind} job on {spec.dataset_uri}: nothing stored, queued or trained")
    rows = [
        ("samples", report.samples),
        ("validation samples", report.validation_samples),
        ("mean tokens per sample", f"{report.mean_tokens:.1f}"),
        ("estimated steps", report.estimated_steps),
        ("estimated time", _duration(report.estimated_seconds)),
        ("estimated memory", _bytes(report.estimated_memory_bytes)),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    if report.score_stats:
        order = ["count", "mean", "std", "min", "max"]
        names = [k for k in order if k in report.score_stats] + sorted(set(report.score_stats) - set(order))
        print()
        print(table(["SCORES", *[n.upper() for n in names]], [["", *[_number(report.score_stats[n]) for n in names]]]))
    for warning in report.warnings:
        print(f"warning: {warning}")


def cmd_submit(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    log = sys.stderr if args.json else sys.stdout  # --json keeps stdout for the JSON
    with _trainer(args) as trainer:
        response = trainer.submit(spec, dry_run=args.dry_run)
        if args.dry_run:
            if args.json:
                print(json.dumps(message_json(response.dry_run), indent=2, sort_keys=True))
            else:
                print_dry_run(spec, response.dry_run)
            return 0
        job = response.job
        if not args.wait:
            if args.json:
                print(json.dumps(job_json(job), indent=2, sort_keys=True))
            else:
                print(job.job_id)
                print(
                    f"job {job.job_id} {state_name(job.state)}; follow it with: flywheel train show {job.job_id}",
                    file=sys.stderr,
                )
            return 0
        print(f"job {job.job_id} {state_name(job.state)} (Ctrl-C to stop watching)", file=log)
        try:
            job = follow(trainer, job.job_id, log=log, poll_s=args.poll, state=job.state)
        except KeyboardInterrupt:
            return _interrupted(trainer, job.job_id, args.cancel_on_interrupt)
    if args.json:
        print(json.dumps(job_json(job), indent=2, sort_keys=True))
    else:
        print_result(job)
    return check_outcome(job)


def check_outcome(job: pb.TrainingJob) -> int:
    """0 for a job that succeeded; a CliError (exit code 1) for one that failed or was cancelled."""
    if job.state == pb.JOB_STATE_FAILED:
        raise CliError(f"job {job.job_id} failed: {one_line(job.error) or 'no reason given'}")
    if job.state == pb.JOB_STATE_CANCELLED:
        raise CliError(f"job {job.job_id} was cancelled at step {job.step}/{job.total_steps}")
    return 0


def _metric_rows(metrics: Any) -> list[list[str]]:
    return [[name, _number(metrics[name])] for name in sorted(metrics)]


def print_result(job: pb.TrainingJob) -> None:
    steps = f"{job.step}/{job.total_steps}"
    if job.state == pb.JOB_STATE_SUCCEEDED:
        print(f"job {job.job_id} succeeded after {steps} steps: policy {job.policy_id or '(none registered)'}")
    elif job.state == pb.JOB_STATE_FAILED:
        print(f"job {job.job_id} failed at step {steps}: {one_line(job.error) or 'no reason given'}")
    else:
        print(f"job {job.job_id} {state_name(job.state)} at step {steps}")
    if job.metrics:
        print(table(["METRIC", "VALUE"], _metric_rows(job.metrics)))
    if job.checkpoint_uri and job.state != pb.JOB_STATE_SUCCEEDED:
        print(f"last checkpoint: {job.checkpoint_uri}")
    if job.state == pb.JOB_STATE_SUCCEEDED and job.policy_id:
        print(f"see it with: flywheel policies show {job.policy_id}")
        print(f"make it active with: flywheel policies promote {job.policy_id}")


# ---- following a job ------------------------------------------------------------------


def _bar_postfix(job: pb.TrainingJob) -> str:
    m = job.metrics
    parts = [f"{k} {_number(m[k])}" for k in _BAR_METRICS if k in m]
    if m.get("groups"):  # GRPO/RLOO: groups whose completions all got one reward teach nothing
        parts.append(f"flat groups {m.get('flat_groups', 0):.0f}/{m['groups']:.0f}")
    if m.get("eta_s"):  # the trainer's estimate, steadier than the bar's own from a few polls
        parts.append(f"eta {_duration(m['eta_s'])}")
    return ", ".join(parts)


def follow(
    trainer: TrainerClient,
    job_id: str,
    *,
    log: Any,
    poll_s: float = _POLL_S,
    state: int = pb.JOB_STATE_UNSPECIFIED,
) -> pb.TrainingJob:
    """Poll GetJob behind a progress bar (stderr) until the job ends; changes of state (from
    ``state``, the last one shown) and new attempts are written to ``log``. Retries while the
    trainer is unavailable."""
    from tqdm import tqdm  # lazily: only this command draws bars

    bar = tqdm(total=None, unit="step", desc=f"job {job_id}", file=sys.stderr, dynamic_ncols=True)
    attempts, failures = 0, 0
    try:
        while True:
            try:
                job = trainer.get_job(job_id)
                failures = 0
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or failures >= _POLL_RETRIES:  # type: ignore[attr-defined]
                    raise
                failures += 1
                bar.write(f"lost the trainer ({one_line(exc.details() or '')}); retrying", file=sys.stderr)  # type: ignore[attr-defined]
                time.sleep(min(_POLL_BACKOFF_S * 2**failures, 8.0))
                continue
            if job.attempts > max(attempts, 1):
                bar.write(f"job {job_id}: attempt {job.attempts} (it resumes from its last checkpoint)", file=log)
            attempts = max(attempts, job.attempts)
            if job.state != state and job.state not in TERMINAL_JOB_STATES:  # the end is printed by the caller
                state = job.state
                worker = f" on {job.worker}" if job.worker and state == pb.JOB_STATE_RUNNING else ""
                bar.write(f"job {job_id} {state_name(state)}{worker}", file=log)
            if job.total_steps and bar.total != job.total_steps:
                bar.total = job.total_steps
            bar.n = job.step
            postfix = _bar_postfix(job)
            if job.cancel_requested and job.state not in TERMINAL_JOB_STATES:
                postfix = ", ".join(filter(None, ("cancelling", postfix)))
            bar.set_postfix_str(postfix, refresh=False)
            if job.state in TERMINAL_JOB_STATES:
                if job.state == pb.JOB_STATE_SUCCEEDED and job.total_steps:
                    bar.n = job.total_steps
                bar.refresh()
                return job
            bar.refresh()
            time.sleep(poll_s)
    finally:
        bar.close()


def _interrupted(trainer: TrainerClient, job_id: str, cancel: bool) -> int:
    if not cancel:
        try:
            cancel = input(f"\ncancel job {job_id} on the trainer? [y/N] ").strip().lower() in ("y", "yes")
        except (EOFError, KeyboardInterrupt, OSError):
            cancel = False
    if cancel:
        job = trainer.cancel_job(job_id)
        print(f"job {job_id}: {_cancel_outcome(job)}", file=sys.stderr)
    else:
        print(f"job {job_id} goes on; see it with: flywheel train show {job_id}", file=sys.stderr)
    return 130


# ---- list, show, cancel ---------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    state = JOB_STATE_FROM_NAME[args.state] if args.state else pb.JOB_STATE_UNSPECIFIED
    with _trainer(args) as trainer:
        jobs = trainer.list_jobs(state=state, limit=args.limit)
    if args.json:
        print(json.dumps([job_json(j) for j in jobs], indent=2, sort_keys=True))
        return 0
    if not jobs:
        print("no jobs")
        return 0
    rows = [
        [
            j.job_id,
            state_name(j.state),
            KIND_NAMES.get(j.spec.kind, str(j.spec.kind)),
            j.spec.policy_name or "-",
            f"{j.step}/{j.total_steps}",
            j.policy_id or "-",
            when(j.created_at, j.HasField("created_at")),
        ]
        for j in jobs
    ]
    print(table(["JOB_ID", "STATE", "KIND", "NAME", "STEP", "POLICY", "CREATED"], rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        job = trainer.get_job(args.job_id)
    if args.json:
        print(json.dumps(job_json(job), indent=2, sort_keys=True))
        return 0
    spec = job.spec
    lines: list[tuple[str, Any]] = [
        ("job", job.job_id),
        ("state", state_name(job.state) + (" (cancel requested)" if job.cancel_requested else "")),
        ("kind", KIND_NAMES.get(spec.kind, str(spec.kind))),
        ("base model", spec.base_model),
        ("dataset", spec.dataset_uri),
        ("name", spec.policy_name or "-"),
        ("endpoint", spec.endpoint or "-"),
        ("parent", spec.parent_policy_id or "-"),
        ("step", f"{job.step}/{job.total_steps}"),
        ("attempts", job.attempts),
        ("worker", job.worker or "-"),
        ("created", when(job.created_at, job.HasField("created_at"))),
        ("started", when(job.started_at, job.HasField("started_at"))),
        ("finished", when(job.finished_at, job.HasField("finished_at"))),
    ]
    lora = spec.lora
    if spec.HasField("lora"):
        modules = ",".join(lora.target_modules) or "from the architecture"
        lines.append(("lora", f"r {lora.r}, alpha {lora.alpha}, dropout {lora.dropout:g}, modules {modules}"))
    if spec.HasField("hyperparameters") and spec.hyperparameters.fields:
        hp = plain_number(json_format.MessageToDict(spec.hyperparameters))
        lines.append(("hyperparameters", json.dumps(hp, sort_keys=True)))
    rewards = [describe_reward(r) for r in spec.rewards]
    if spec.reward_policy_id:
        rewards.insert(0, f"reward_model:{spec.reward_policy_id}")
    if rewards:
        lines.append(("rewards", ", ".join(rewards)))
    if spec.eval_metrics:
        lines.append(("eval metrics", ", ".join(describe_verifiable(m) for m in spec.eval_metrics)))
    if spec.multi_turn.environment:
        lines.append(("multi-turn", f"{spec.multi_turn.environment} (max turns {spec.multi_turn.max_turns or '-'})"))
    for label, value in (
        ("checkpoint", job.checkpoint_uri),
        ("adapter", job.adapter_uri),
        ("policy", job.policy_id),
        ("error", one_line(job.error)),
    ):
        if value:
            lines.append((label, value))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}")
    if job.metrics:
        print()
        print(table(["METRIC", "VALUE"], _metric_rows(job.metrics)))
    return 0


def _cancel_outcome(job: pb.TrainingJob) -> str:
    if job.state == pb.JOB_STATE_CANCELLED:
        return f"cancelled at step {job.step}/{job.total_steps}"
    if job.cancel_requested and job.state not in TERMINAL_JOB_STATES:
        return (
            f"cancel requested at step {job.step}/{job.total_steps}; "
            "it stops at its next step and keeps its last checkpoint"
        )
    return state_name(job.state)


def cmd_cancel(args: argparse.Namespace) -> int:
    with _trainer(args) as trainer:
        job = trainer.cancel_job(args.job_id)
    if job.state in TERMINAL_JOB_STATES and job.state != pb.JOB_STATE_CANCELLED:
        raise CliError(f"job {job.job_id} is {state_name(job.state)}: only a queued or running job can be cancelled")
    print(f"job {job.job_id} {_cancel_outcome(job)}")
    return 0


# ---- parsers --------------------------------------------------------------------------


def add_parsers(commands: Any) -> None:
    """``flywheel train ...`` under the CLI's top-level subcommands."""
    train = commands.add_parser("train", help="submit, follow, list and cancel training jobs (the trainer)")
    actions = train.add_subparsers(dest="train_command", required=True, metavar="ACTION")

    submit = actions.add_parser(
        "submit",
        help="submit a training job (or --dry-run: check and estimate it)",
        description="Queue a training job on the trainer and print its id. --dry-run checks the job "
        "and prints the sample count, score statistics and estimated steps, time and memory, "
        "training and queueing nothing. --wait follows the job with a progress bar until it ends "
        "and prints the policy it registered; exit code 1 if it failed or was cancelled.",
    )
    submit.add_argument("--kind", required=True, choices=list(KIND_FROM_NAME), help="what to train")
    submit.add_argument("--dataset", required=True, metavar="URI", help="dataset manifest URI (ExportDataset's)")
    submit.add_argument("--base-model", required=True, metavar="MODEL", help="base model name or object-store URI")
    submit.add_argument("--name", metavar="NAME", help="policy name the version is registered under")
    submit.add_argument("--endpoint", metavar="ENDPOINT", help="endpoint whose canary arm the policy becomes")
    submit.add_argument("--canary-cap", type=_share, metavar="SHARE", help="largest traffic share of the canary arm")
    submit.add_argument("--parent", metavar="POLICY_ID", help="version this one is trained from (lineage)")
    lora = submit.add_argument_group("LoRA")
    lora.add_argument("--lora-r", type=positive_int, default=16, metavar="R", help="rank (default 16)")
    lora.add_argument("--lora-alpha", type=positive_int, default=32, metavar="ALPHA", help="alpha (default 32)")
    lora.add_argument("--lora-dropout", type=_dropout, default=0.05, metavar="P", help="dropout (default 0.05)")
    lora.add_argument(
        "--lora-target-modules", metavar="A,B", help="comma-separated modules (default: from the architecture)"
    )
    submit.add_argument(
        "--hp",
        action="extend",
        nargs="+",
        type=_parsed(parse_hyperparameter),
        metavar="KEY=VALUE",
        help="hyperparameters, e.g. --hp learning_rate=1e-5 max_steps=3 beta=0.1; numbers and "
        "true/false are sent as such",
    )
    submit.add_argument(
        "--reward",
        action="append",
        type=_parsed(parse_reward),
        metavar="REWARD",
        help=f"grpo/rloo: a reward (repeat; summed by weight): {REWARD_FORMS}, each with an optional :weight=W",
    )
    submit.add_argument(
        "--eval-metric",
        action="append",
        type=_parsed(parse_verifiable),
        metavar="METRIC",
        help="a metric computed on the held-out split (repeat): exact_match:COLUMN or callable:MODULE:FUNCTION",
    )
    submit.add_argument(
        "--environment", metavar="MODULE:FUNCTION", help="grpo: multi-turn environment or simulated user"
    )
    submit.add_argument("--max-turns", type=positive_int, metavar="N", help="most assistant turns (with --environment)")
    how = submit.add_mutually_exclusive_group()
    how.add_argument("--dry-run", action="store_true", help="check and estimate; queue nothing")
    how.add_argument("--wait", action="store_true", help="follow the job with a progress bar until it ends")
    submit.add_argument("--poll", type=_positive_s, default=_POLL_S, metavar="SECONDS", help="--wait: poll interval")
    submit.add_argument("--cancel-on-interrupt", action="store_true", help="--wait: Ctrl-C cancels without asking")
    submit.add_argument("--json", action="store_true", help="print the job (or the dry-run report) as JSON")
    connection_options(submit, TRAINER)
    submit.set_defaults(func=cmd_submit)

    lst = actions.add_parser("list", help="list training jobs, newest first")
    lst.add_argument("--state", choices=list(JOB_STATE_FROM_NAME), help="only jobs in this state")
    lst.add_argument("--limit", type=positive_int, default=20, metavar="N", help="at most this many (default 20)")
    lst.add_argument("--json", action="store_true", help="print the jobs as JSON")
    connection_options(lst, TRAINER)
    lst.set_defaults(func=cmd_list)

    show = actions.add_parser("show", help="a job's spec, state, progress, metrics and policy")
    show.add_argument("job_id", metavar="JOB_ID")
    show.add_argument("--json", action="store_true", help="print the job as JSON")
    connection_options(show, TRAINER)
    show.set_defaults(func=cmd_show)

    cancel = actions.add_parser(
        "cancel",
        help="cancel a queued or running job",
        description="A queued job is cancelled at once; a running one stops at its next step and keeps "
        "its last checkpoint. Exit code 1 if the job already ended.",
    )
    cancel.add_argument("job_id", metavar="JOB_ID")
    connection_options(cancel, TRAINER)
    cancel.set_defaults(func=cmd_cancel)
    for parser in (train, submit, lst, show, cancel):
        parser.set_defaults(service=TRAINER)
