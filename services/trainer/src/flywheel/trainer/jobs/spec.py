"""A submitted TrainingJobSpec, checked at the door and turned into what the runner needs.

Everything that can be told from the request alone is refused here with INVALID_ARGUMENT
naming the field (``spec.hyperparameters.learning_rate``): unknown kinds, hyperparameters
that are unknown, NaN, negative or of the wrong type, LoRA shapes, reward sources a kind
cannot take or the run policy refuses, names that are not subject tokens. What needs the
data (columns, sample count) or the registry (the reward model version) is checked by the
servicer right after, still before anything is stored."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from pydantic import ValidationError

from flywheel.api.subjects import subject_token
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.api.values import plain_number
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.validation import Invalid, check_string
from flywheel.trainer.training.spec import LoraSettings, RewardFunction, TrainSpec

MAX_URI = 2048
MAX_SOURCES = 16
KIND_NAMES: dict[int, str] = {
    jobs_pb2.TRAINING_KIND_REWARD_MODEL: "reward_model",
    jobs_pb2.TRAINING_KIND_SFT: "sft",
    jobs_pb2.TRAINING_KIND_DPO: "dpo",
    jobs_pb2.TRAINING_KIND_KTO: "kto",
    jobs_pb2.TRAINING_KIND_GRPO: "grpo",
    jobs_pb2.TRAINING_KIND_RLOO: "rloo",
}
KIND_VALUES = {v: k for k, v in KIND_NAMES.items()}
ONLINE = ("grpo", "rloo")
# Hyperparameters a job may set: TrainSpec's own fields, plus epochs (turned into max_steps).
HYPERPARAMETERS = (
    "max_steps",
    "epochs",
    "learning_rate",
    "batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "save_steps",
    "seed",
    "beta",
    "num_generations",
    "max_completion_length",
    "temperature",
)
# Base models that need no file: the tiny random test model and SmolLM2 from its PyPI package.
BUILTIN_MODELS = ("tiny", "smollm2")


@dataclass(frozen=True)
class RewardSourceDesc:
    """One reward of a GRPO/RLOO job as submitted (resolved into a function by the runner)."""

    weight: float
    reward_policy_id: str = ""
    judge_rubric: str | None = None
    judge_rank: bool = False
    exact_match_column: str = ""
    callable: str = ""
    # RLP's information gain: the dataset column holding the observed outcome text.
    outcome_column: str = ""
    # Where the source came from in the request (spec.rewards[i]), for errors about its data.
    request_field: str = ""


@dataclass(frozen=True)
class JobRequest:
    """A checked job: its kind, names and the hyperparameters as TrainSpec fields."""

    kind: str
    base_model: str
    dataset_uri: str
    hyperparameters: dict[str, Any]
    lora: LoraSettings
    policy_name: str
    endpoint: str
    parent_policy_id: str
    canary_traffic_cap: float
    rewards: tuple[RewardSourceDesc, ...] = ()
    eval_metrics: tuple[RewardSourceDesc, ...] = ()
    multi_turn_environment: str = ""
    multi_turn_max_turns: int = 0
    spec_json: dict[str, Any] = field(default_factory=dict)

    def train_spec(
        self, *, samples: int, rewards: tuple[RewardFunction, ...] = (), base_model: str | None = None, **extra: Any
    ) -> TrainSpec:
        """The TrainSpec of this job over ``samples`` rows: ``epochs`` (default 1) becomes
        max_steps when max_steps is not given."""
        hp = dict(self.hyperparameters)
        epochs = hp.pop("epochs", None)
        if "max_steps" not in hp:
            per_step = hp.get("batch_size", 2) * hp.get("gradient_accumulation_steps", 1)
            hp["max_steps"] = max(1, math.ceil((epochs or 1.0) * samples / per_step))
        return TrainSpec(
            kind=self.kind,  # type: ignore[arg-type]
            base_model=base_model or self.base_model,
            lora=self.lora,
            rewards=rewards,
            **hp,
            **extra,
        )


def placeholder_reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)


def _token(value: str, field_name: str, what: str) -> str:
    try:
        return subject_token(value, what=what)
    except ValueError:
        raise Invalid(field_name, "must be 1-64 characters of [A-Za-z0-9_-] (it is a NATS subject token)") from None


def _hyperparameters(spec: jobs_pb2.TrainingJobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Read the Values one by one: a NaN cannot go through MessageToDict.
    for key, raw in spec.hyperparameters.fields.items():
        name = f"spec.hyperparameters.{key}"
        if key not in HYPERPARAMETERS:
            raise Invalid(name, f"unknown hyperparameter; known: {', '.join(HYPERPARAMETERS)}")
        if raw.WhichOneof("kind") != "number_value":
            raise Invalid(name, f"must be a number, got {raw.WhichOneof('kind')}")
        if not math.isfinite(raw.number_value):
            raise Invalid(name, "must be finite")
        value = plain_number(raw.number_value)
        if key == "epochs" and not 0 < value <= 1000:
            raise Invalid(name, "must be in (0, 1000]")
        out[key] = value
    return out


def _verifiable(
    source: jobs_pb2.VerifiableReward, weight: float, name: str, policy: RunPolicySettings
) -> RewardSourceDesc:
    check = source.WhichOneof("check")
    if check == "exact_match_column":
        column = check_string(source.exact_match_column, f"{name}.exact_match_column", max_len=128, required=True)
        return RewardSourceDesc(weight=weight, exact_match_column=column)
    if check == "callable":
        path = check_string(source.callable, f"{name}.callable", max_len=256, required=True)
        problem = policy.callable_problem(path)
        if problem:
            raise Invalid(f"{name}.callable", problem)
        return RewardSourceDesc(weight=weight, callable=path)
    raise Invalid(name, "set exact_match_column or callable")


def _information_gain(
    source: jobs_pb2.InformationGainReward, weight: float, name: str, spec: jobs_pb2.TrainingJobSpec
) -> RewardSourceDesc:
    """RLP's reward: the outcome column is checked against the data by the servicer
    (:func:`flywheel.trainer.jobs.datasets.check_reward_columns`). The adapter-free base it
    scores with is always there: every job trains a LoRA adapter."""
    from flywheel.trainer.training.information_gain_reward import DEFAULT_OUTCOME_COLUMN, RESERVED_COLUMNS

    where = f"{name}.information_gain.outcome_column"
    column = check_string(source.outcome_column, where, max_len=128) or DEFAULT_OUTCOME_COLUMN
    if column in RESERVED_COLUMNS:
        raise Invalid(where, f"{column!r} is not a column rewards receive; name the column holding the outcome text")
    if spec.HasField("multi_turn"):
        raise Invalid(f"{name}.information_gain", "scores one thought per prompt; not with multi_turn rollouts")
    return RewardSourceDesc(weight=weight, outcome_column=column, request_field=name)


def _rewards(spec: jobs_pb2.TrainingJobSpec, kind: str, policy: RunPolicySettings) -> tuple[RewardSourceDesc, ...]:
    if len(spec.rewards) > MAX_SOURCES:
        raise Invalid("spec.rewards", f"at most {MAX_SOURCES} reward sources")
    out: list[RewardSourceDesc] = []
    if spec.reward_policy_id:
        pid = check_string(spec.reward_policy_id, "spec.reward_policy_id", max_len=64)
        out.append(RewardSourceDesc(weight=1.0, reward_policy_id=pid))
    for i, source in enumerate(spec.rewards):
        name = f"spec.rewards[{i}]"
        weight = source.weight if source.weight != 0 else 1.0
        if not math.isfinite(weight):
            raise Invalid(f"{name}.weight", "must be finite")
        which = source.WhichOneof("source")
        if which == "reward_policy_id":
            pid = check_string(source.reward_policy_id, f"{name}.reward_policy_id", max_len=64, required=True)
            out.append(RewardSourceDesc(weight=weight, reward_policy_id=pid))
        elif which == "judge":
            rubric = check_string(source.judge.rubric, f"{name}.judge.rubric", max_len=128)
            out.append(RewardSourceDesc(weight=weight, judge_rubric=rubric or "default", judge_rank=source.judge.rank))
        elif which == "verifiable":
            out.append(_verifiable(source.verifiable, weight, f"{name}.verifiable", policy))
        elif which == "information_gain":
            out.append(_information_gain(source.information_gain, weight, name, spec))
        else:
            raise Invalid(name, "set reward_policy_id, judge, verifiable or information_gain")
    if kind in ONLINE and not out:
        raise Invalid("spec.rewards", f"a {kind} job needs at least one reward (rewards or reward_policy_id)")
    if kind not in ONLINE and out:
        raise Invalid("spec.rewards", f"only grpo and rloo jobs take rewards, not {kind}")
    return tuple(out)


def _base_model(value: str) -> str:
    base = check_string(value, "spec.base_model", max_len=MAX_URI, required=True, what="the base model")
    if base in BUILTIN_MODELS or base.startswith("s3://"):
        return base
    path = Path(base)
    if not path.is_absolute():
        raise Invalid(
            "spec.base_model",
            f"{base!r} is not 'tiny', 'smollm2', an s3:// prefix or an absolute local path "
            "(models are never downloaded from a hub at run time)",
        )
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise Invalid("spec.base_model", f"{base!r}: no such model folder or .gguf file on this trainer")
    return base


def parse_job(spec: jobs_pb2.TrainingJobSpec, *, policy: RunPolicySettings) -> JobRequest:
    """Check ``spec`` and return the job it asks for, or raise Invalid naming the field."""
    kind = KIND_NAMES.get(spec.kind)
    if kind is None:
        raise Invalid("spec.kind", f"must be one of {', '.join(f'TRAINING_KIND_{k.upper()}' for k in KIND_VALUES)}")
    base = _base_model(spec.base_model)
    dataset = check_string(spec.dataset_uri, "spec.dataset_uri", max_len=MAX_URI, required=True, what="a manifest")
    if not dataset.startswith("s3://") or dataset.rstrip("/").count("/") < 3:
        raise Invalid("spec.dataset_uri", f"{dataset!r} is not an s3://bucket/key manifest URI")
    endpoint = _token(spec.endpoint, "spec.endpoint", "endpoint") if spec.endpoint else ""
    name = spec.policy_name or endpoint or f"{kind.replace('_', '-')}-policy"
    name = _token(name, "spec.policy_name", "policy name")
    parent = check_string(spec.parent_policy_id, "spec.parent_policy_id", max_len=64)
    cap = spec.canary_traffic_cap
    if not (math.isfinite(cap) and 0 <= cap <= 1):
        raise Invalid("spec.canary_traffic_cap", "must be in [0, 1] (0 means 0.1)")
    hp = _hyperparameters(spec)
    lora_fields = {"r": spec.lora.r or 16, "alpha": spec.lora.alpha or 32, "dropout": spec.lora.dropout or 0.05}
    if spec.lora.target_modules:
        lora_fields["target_modules"] = tuple(spec.lora.target_modules)
    try:
        lora = LoraSettings(**lora_fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise Invalid(f"spec.lora.{err['loc'][0]}", err["msg"]) from None
    rewards = _rewards(spec, kind, policy)
    metrics = tuple(_verifiable(m, 1.0, f"spec.eval_metrics[{i}]", policy) for i, m in enumerate(spec.eval_metrics))
    environment = ""
    if spec.HasField("multi_turn"):
        if kind != "grpo":
            raise Invalid("spec.multi_turn", f"multi-turn rollouts are a grpo feature, not {kind}")
        environment = check_string(
            spec.multi_turn.environment, "spec.multi_turn.environment", max_len=256, required=True
        )
        problem = policy.callable_problem(environment)
        if problem:
            raise Invalid("spec.multi_turn.environment", problem)
        if not 1 <= spec.multi_turn.max_turns <= 64:
            raise Invalid("spec.multi_turn.max_turns", "must be in [1, 64]")
    job = JobRequest(
        kind=kind,
        base_model=base,
        dataset_uri=dataset,
        hyperparameters=hp,
        lora=lora,
        policy_name=name,
        endpoint=endpoint,
        parent_policy_id=parent,
        canary_traffic_cap=cap or 0.1,
        rewards=rewards,
        eval_metrics=metrics,
        multi_turn_environment=environment,
        multi_turn_max_turns=spec.multi_turn.max_turns if environment else 0,
        spec_json=MessageToDict(spec, preserving_proto_field_name=True),
    )
    _check_hyperparameters(job)
    return job


def _check_hyperparameters(job: JobRequest) -> None:
    """Build the TrainSpec once (placeholder rewards, a nominal sample count) so its own
    validation (positive learning rate, batch size...) answers at the door."""
    placeholder = (RewardFunction(fn=placeholder_reward),) if job.kind in ONLINE else ()
    try:
        job.train_spec(samples=10, rewards=placeholder, base_model="tiny")
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "spec.hyperparameters"
        raise Invalid(f"spec.hyperparameters.{where}", err["msg"]) from None


def job_from_json(spec_json: dict[str, Any], *, policy: RunPolicySettings) -> JobRequest:
    """The stored spec (proto3 JSON) parsed again by the runner."""
    from google.protobuf.json_format import ParseDict

    return parse_job(ParseDict(spec_json, jobs_pb2.TrainingJobSpec()), policy=policy)
