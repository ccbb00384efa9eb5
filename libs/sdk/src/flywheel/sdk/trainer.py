"""Training jobs and the policy registry over gRPC (blocking), and the text forms of a job's
rewards and hyperparameters that ``flywheel train submit`` reads.

    with TrainerClient(target="127.0.0.1:50056") as trainer:
        spec = jobs_pb2.TrainingJobSpec(kind=KIND_FROM_NAME["grpo"], base_model="tiny",
                                        dataset_uri="s3://exports/ds1/manifest.json",
                                        rewards=[parse_reward("exact_match:answer")])
        report = trainer.submit(spec, dry_run=True).dry_run   # samples, estimates; nothing queued
        job = trainer.submit(spec).job
        job = trainer.get_job(job.job_id)                      # step, total_steps, metrics
        trainer.promote(job.policy_id, reason="won the canary")
        trainer.rollback("support-bot", reason="feedback fell")

Text forms (``parse_reward``, ``parse_verifiable``, ``parse_hyperparameter``):

- a reward: ``judge[:rubric=NAME][:rank]``, ``reward_model:POLICY_ID``,
  ``exact_match:COLUMN`` or ``callable:MODULE:FUNCTION``, each with an optional
  ``:weight=W`` at the end (default 1);
- an evaluation metric: ``exact_match:COLUMN`` or ``callable:MODULE:FUNCTION``;
- a hyperparameter: ``KEY=VALUE``, the value a bool (``true``/``false``), an integer, a
  finite number, or else the text as given.
"""

from __future__ import annotations

import math
import re

import grpc

from flywheel.api.trainer.v1 import jobs_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2 as svc
from flywheel.api.trainer.v1.trainer_service_pb2_grpc import TrainerServiceStub
from flywheel.api.values import MAX_EXACT_INT
from flywheel.sdk import _transport

__all__ = [
    "JOB_STATE_FROM_NAME",
    "JOB_STATE_NAMES",
    "KIND_FROM_NAME",
    "KIND_NAMES",
    "POLICY_STATUS_NAMES",
    "TERMINAL_JOB_STATES",
    "TrainerClient",
    "describe_reward",
    "parse_hyperparameter",
    "parse_reward",
    "parse_verifiable",
]

KIND_NAMES = {
    pb.TRAINING_KIND_REWARD_MODEL: "reward_model",
    pb.TRAINING_KIND_SFT: "sft",
    pb.TRAINING_KIND_DPO: "dpo",
    pb.TRAINING_KIND_KTO: "kto",
    pb.TRAINING_KIND_GRPO: "grpo",
    pb.TRAINING_KIND_RLOO: "rloo",
}
KIND_FROM_NAME = {name: kind for kind, name in KIND_NAMES.items()}
# SubmitJob reads and checks the dataset before answering: more than a metadata call.
SUBMIT_TIMEOUT_S = 180.0

# The kinds that generate completions and score them with rewards.
ONLINE_KINDS = frozenset({pb.TRAINING_KIND_GRPO, pb.TRAINING_KIND_RLOO})

JOB_STATE_NAMES = {
    pb.JOB_STATE_UNSPECIFIED: "unspecified",
    pb.JOB_STATE_QUEUED: "queued",
    pb.JOB_STATE_RUNNING: "running",
    pb.JOB_STATE_SUCCEEDED: "succeeded",
    pb.JOB_STATE_FAILED: "failed",
    pb.JOB_STATE_CANCELLED: "cancelled",
}
JOB_STATE_FROM_NAME = {name: s for s, name in JOB_STATE_NAMES.items() if s != pb.JOB_STATE_UNSPECIFIED}
TERMINAL_JOB_STATES = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})

POLICY_STATUS_NAMES = {
    pb.POLICY_STATUS_UNSPECIFIED: "unspecified",
    pb.POLICY_STATUS_REGISTERED: "registered",
    pb.POLICY_STATUS_CANARY: "canary",
    pb.POLICY_STATUS_ACTIVE: "active",
    pb.POLICY_STATUS_RETIRED: "retired",
    pb.POLICY_STATUS_ROLLED_BACK: "rolled_back",
    pb.POLICY_STATUS_FAILED: "failed",
}


class TrainerClient(_transport.BlockingClient):
    """Blocking client for TrainerService: jobs and policy versions. Errors are the server's
    ``grpc.RpcError`` (NOT_FOUND, INVALID_ARGUMENT naming the field, FAILED_PRECONDITION naming
    the registry rule a refused change breaks)."""

    def _bind(self, channel: grpc.Channel) -> None:
        self._stub = TrainerServiceStub(channel)

    # -- jobs ------------------------------------------------------------------------------

    def submit(self, spec: pb.TrainingJobSpec, *, dry_run: bool = False) -> svc.SubmitJobResponse:
        """Queue a job (``response.job``), or with ``dry_run`` only check and estimate it
        (``response.dry_run``: nothing is stored, queued or trained). The trainer reads the
        whole dataset (and for a dry run the base model's tokenizer) first, so this call gets
        at least SUBMIT_TIMEOUT_S."""
        request = svc.SubmitJobRequest(spec=spec, dry_run=dry_run)
        return self._stub.SubmitJob(  # type: ignore[no-any-return]
            request, timeout=max(self._timeout, SUBMIT_TIMEOUT_S), metadata=self._metadata
        )

    def get_job(self, job_id: str) -> pb.TrainingJob:
        return self._call(self._stub.GetJob, svc.GetJobRequest(job_id=job_id)).job

    def list_jobs(self, *, state: int = pb.JOB_STATE_UNSPECIFIED, limit: int = 0) -> list[pb.TrainingJob]:
        """Most recent first; ``limit`` 0 is the server's default (100)."""
        return list(self._call(self._stub.ListJobs, svc.ListJobsRequest(state=state, limit=limit)).jobs)  # type: ignore[arg-type]

    def cancel_job(self, job_id: str) -> pb.TrainingJob:
        """A queued job is cancelled at once; a running one stops at its next step."""
        return self._call(self._stub.CancelJob, svc.CancelJobRequest(job_id=job_id)).job

    # -- policies --------------------------------------------------------------------------

    def get_policy(self, policy_id: str) -> pb.Policy:
        return self._call(self._stub.GetPolicy, svc.GetPolicyRequest(policy_id=policy_id)).policy

    def list_policies(self, name: str = "") -> list[pb.Policy]:
        """Every version (of one name when ``name`` is given), newest first."""
        return list(self._call(self._stub.ListPolicies, svc.ListPoliciesRequest(name=name)).policies)

    def set_status(self, policy_id: str, status: int, *, reason: str = "", actor: str = "") -> pb.Policy:
        request = svc.SetPolicyStatusRequest(policy_id=policy_id, status=status, reason=reason, actor=actor)  # type: ignore[arg-type]
        return self._call(self._stub.SetPolicyStatus, request).policy

    def promote(self, policy_id: str, *, reason: str = "", actor: str = "") -> svc.PromotePolicyResponse:
        """Make the version active; ``response.retired`` is the version that was active before."""
        request = svc.PromotePolicyRequest(policy_id=policy_id, reason=reason, actor=actor)
        return self._call(self._stub.PromotePolicy, request)

    def rollback(self, name: str, *, reason: str = "", actor: str = "") -> svc.RollbackPolicyResponse:
        """Roll the active version of ``name`` back; ``response.policy`` is active again."""
        request = svc.RollbackPolicyRequest(name=name, reason=reason, actor=actor)
        return self._call(self._stub.RollbackPolicy, request)


# ---- text forms -----------------------------------------------------------------------

_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
REWARD_FORMS = "judge[:rubric=NAME][:rank], reward_model:POLICY_ID, exact_match:COLUMN or callable:MODULE:FUNCTION"


def _weight(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value == 0:
        raise ValueError(f"{where}: weight {text!r} is not a non-zero finite number")
    return value


def parse_verifiable(text: str, *, what: str = "metric") -> pb.VerifiableReward:
    """``exact_match:COLUMN`` or ``callable:MODULE:FUNCTION``."""
    kind, sep, rest = text.partition(":")
    if kind == "exact_match" and sep and rest and ":" not in rest:
        return pb.VerifiableReward(exact_match_column=rest)
    if kind == "callable" and _CALLABLE.match(rest):
        return pb.VerifiableReward(callable=rest)
    raise ValueError(f"{what} {text!r}: expected exact_match:COLUMN or callable:MODULE:FUNCTION")


def parse_reward(text: str) -> pb.RewardSource:
    """One weighted reward of a GRPO/RLOO job from its text form (see the module docstring)."""
    where = f"reward {text!r}"
    parts = text.split(":")
    weight = 1.0
    if len(parts) > 1 and parts[-1].startswith("weight="):
        weight = _weight(parts.pop().removeprefix("weight="), where)
    kind, args = parts[0], parts[1:]
    if kind == "judge":
        judge = pb.JudgeReward()
        for arg in args:
            key, sep, value = arg.partition("=")
            if key == "rubric" and sep and value:
                judge.rubric = value
            elif arg == "rank":
                judge.rank = True
            else:
                raise ValueError(f"{where}: unknown judge option {arg!r} (rubric=NAME, rank, weight=W)")
        return pb.RewardSource(weight=weight, judge=judge)
    if kind == "reward_model":
        if len(args) != 1 or not args[0]:
            raise ValueError(f"{where}: expected reward_model:POLICY_ID")
        return pb.RewardSource(weight=weight, reward_policy_id=args[0])
    if kind in ("exact_match", "callable"):
        return pb.RewardSource(weight=weight, verifiable=parse_verifiable(":".join(parts), what="reward"))
    raise ValueError(f"{where}: expected {REWARD_FORMS}, each with an optional :weight=W")


def describe_reward(source: pb.RewardSource) -> str:
    """The text form of a reward (what ``parse_reward`` reads)."""
    which = source.WhichOneof("source")
    if which == "judge":
        text = "judge" + (f":rubric={source.judge.rubric}" if source.judge.rubric else "")
        text += ":rank" if source.judge.rank else ""
    elif which == "reward_policy_id":
        text = f"reward_model:{source.reward_policy_id}"
    elif which == "verifiable":
        text = describe_verifiable(source.verifiable)
    else:
        text = "(none)"
    return text + (f":weight={source.weight:g}" if source.weight not in (0, 1) else "")


def describe_verifiable(check: pb.VerifiableReward) -> str:
    which = check.WhichOneof("check")
    if which == "exact_match_column":
        return f"exact_match:{check.exact_match_column}"
    if which == "callable":
        return f"callable:{check.callable}"
    return "(none)"


def parse_hyperparameter(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE``: a bool, an integer, a finite number, or the text as given."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"hyperparameter {text!r}: expected KEY=VALUE (e.g. learning_rate=1e-5)")
    value = raw.strip()
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    try:
        number = int(value)
    except ValueError:
        pass
    else:
        if abs(number) > MAX_EXACT_INT:  # sent as a double: it would come back as another number
            raise ValueError(f"hyperparameter {key}: {value} is beyond +-2**53, which a double cannot hold exactly")
        return key, number
    try:
        real = float(value)
    except ValueError:
        return key, value
    if not math.isfinite(real):
        raise ValueError(f"hyperparameter {key}: {value!r} is not a finite number")
    return key, real
