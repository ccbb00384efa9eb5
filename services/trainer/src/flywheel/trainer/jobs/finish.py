"""What a job needs besides training: its reward functions before, and after it the
upload, the held-out evaluation, the registration and (when it names an endpoint) the canary
enrolment.

After a successful run, in order (each step safe to repeat when a crash interrupts it and
the job is redelivered):
1. the adapter (with its tokenizer) and ``training_results.json`` go to S3 under
   ``<checkpoints bucket>/jobs/<job_id>/``;
2. the held-out (validation) split is evaluated: a reward model's pairwise accuracy, a
   policy's win rate against its base judged by the reward judge, and the verifiable metrics
   the job names;
3. the version is registered with its lineage and those figures (a job registers at most one
   version: a redelivered job finds the one it registered before);
4. with an endpoint, the version is loaded by the model server and enrolled as a canary arm;
5. the job is SUCCEEDED, naming its policy version.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.judge_client import JudgeClient
from flywheel.core.logging import get_logger
from flywheel.core.objects import ObjectStore
from flywheel.trainer.jobs import service, storage
from flywheel.trainer.jobs.models import SUCCEEDED
from flywheel.trainer.jobs.spec import KIND_VALUES, RewardSourceDesc
from flywheel.trainer.registry import service as registry
from flywheel.trainer.registry.events import PolicyEvents
from flywheel.trainer.registry.rules import Status
from flywheel.trainer.settings import TrainerSettings

if TYPE_CHECKING:
    from flywheel.trainer.jobs.progress import ProgressReporter
    from flywheel.trainer.jobs.runner import Prepared
    from flywheel.trainer.registry.canary import Canaries
    from flywheel.trainer.training.run import TrainResult

log = get_logger(__name__)
ACTOR = "trainer"
RESULTS_FILE = "training_results.json"  # as written by flywheel.trainer.training.run


@dataclass(frozen=True)
class Outcome:
    policy_id: str
    adapter_uri: str
    metrics: dict[str, float]
    arm_id: str = ""


def judge_client(settings: TrainerSettings) -> JudgeClient:
    """A reward-judge client from the trainer's settings (unconfigured: every call says so)."""
    return JudgeClient(
        settings.judge_address,
        auth_token=settings.link_token("judge"),
        tls=settings.link_tls("judge"),
        timeout_s=settings.judge_timeout_s,
        address_setting=TrainerSettings.env_var("judge_address"),
    )


class Finisher:
    """Rewards before training, and everything after it (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: TrainerSettings,
        sessions: async_sessionmaker[AsyncSession],
        objects: ObjectStore,
        events: PolicyEvents,
        canaries: Canaries | None,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._objects = objects
        self._events = events
        self._canaries = canaries

    # -- before training -------------------------------------------------------------------------

    async def rewards(self, prepared: Prepared, *, job_id: str, work_dir: Path) -> tuple[Any, ...]:
        """The job's reward functions (GRPO/RLOO), reward-model versions downloaded first."""
        if not prepared.job.rewards:
            return ()
        from flywheel.trainer.training.reward_sources import RewardSourceSpec, build_rewards

        specs = [RewardSourceSpec(**await self._source_fields(s, work_dir)) for s in prepared.job.rewards]
        judge = judge_client(self._settings) if any(s.judge_rubric for s in prepared.job.rewards) else None
        return await asyncio.to_thread(
            build_rewards,
            specs,
            judge=judge,
            policy=self._settings.policy,
            base_model=prepared.base_model,
            num_generations=int(prepared.job.hyperparameters.get("num_generations", 4)),
        )

    async def _source_fields(self, source: RewardSourceDesc, work_dir: Path) -> dict[str, Any]:
        fields: dict[str, Any] = {"weight": source.weight}
        if source.reward_policy_id:
            folder, base = await self.reward_model(source.reward_policy_id, work_dir)
            fields.update(reward_model_dir=str(folder), reward_model_base=base, name=source.reward_policy_id)
        elif source.judge_rubric:
            fields.update(judge_rubric=source.judge_rubric, judge_rank=source.judge_rank)
        elif source.exact_match_column:
            fields["exact_match_column"] = source.exact_match_column
        elif source.outcome_column:
            fields["information_gain_column"] = source.outcome_column
        else:
            fields["callable"] = source.callable
        return fields

    async def reward_model(self, policy_id: str, work_dir: Path) -> tuple[Path, str]:
        """Download a registered reward-model version's adapter (checked: it is one), and its
        base model when that lives in S3; returns (adapter folder, base model)."""
        async with self._sessions() as session:
            row = await registry.get_policy(session, policy_id=policy_id)
        problem = reward_policy_problem(row)
        if problem:
            raise ValueError(f"reward_policy_id {policy_id!r}: {problem}")
        target = work_dir / "reward_models" / policy_id
        await asyncio.to_thread(storage.download_prefix, self._objects.client, row.checkpoint_uri, target)
        return target, await self.local_base(row.base_model)

    async def local_base(self, base: str) -> str:
        """A base model named by an s3:// prefix, downloaded once into the work dir."""
        if not base.startswith("s3://"):
            return base
        bucket, prefix = storage.split_uri(base)
        target = self._settings.work_dir / "models" / bucket / prefix
        await asyncio.to_thread(storage.download_prefix, self._objects.client, base, target)
        return str(target)

    # -- after training --------------------------------------------------------------------------

    async def finish(
        self, *, job_id: str, prepared: Prepared, result: TrainResult, reporter: ProgressReporter
    ) -> Outcome:
        job = prepared.job
        bucket = self._objects.bucket(storage.CHECKPOINTS)
        await reporter.state("running", step=result.global_step, total_steps=result.global_step, message="evaluating")
        evaluation = await self._evaluate(prepared, result)
        metrics = {**_training_figures(result), **evaluation}
        extra = {
            "job_id": job_id,
            "dataset_uri": job.dataset_uri,
            "manifest_sha256": prepared.manifest_sha256,
            "evaluation": evaluation,
        }
        results = await asyncio.to_thread(_add_to_results, Path(result.results_path), extra)
        adapter_uri = await asyncio.to_thread(
            storage.upload_dir, self._objects.client, bucket, f"jobs/{job_id}/adapter", Path(result.adapter_dir)
        )
        await self._objects.put_bytes(
            storage.CHECKPOINTS, f"jobs/{job_id}/{RESULTS_FILE}", results, content_type="application/json"
        )
        policy_id = await self._register(job_id, prepared, adapter_uri, metrics)
        message = f"registered {policy_id}"
        arm_id = ""
        if job.endpoint:
            arm_id, note = await self._enrol(policy_id, job.endpoint, job.canary_traffic_cap)
            message += f"; {note}"
        async with self._sessions() as session:
            row = await service.finish(
                session,
                job_id=job_id,
                state=SUCCEEDED,
                policy_id=policy_id,
                adapter_uri=adapter_uri,
                metrics=metrics,
                step=result.global_step,
                error="" if not job.endpoint or arm_id else message,
            )
            await session.commit()
        await reporter.state(SUCCEEDED, step=row.step, total_steps=row.total_steps, metrics=metrics, message=message)
        return Outcome(policy_id, adapter_uri, service.finite_metrics(metrics), arm_id)

    async def _evaluate(self, prepared: Prepared, result: TrainResult) -> dict[str, float]:
        rows = prepared.validation_rows
        if not rows:
            log.warning("no validation rows: the version is registered without held-out figures")
            return {"eval_samples": 0.0}
        settings = self._settings
        from flywheel.trainer.training import evaluate

        if prepared.job.kind == "reward_model":
            evaluation = await asyncio.to_thread(
                evaluate.evaluate_reward_model,
                result.adapter_dir,
                prepared.base_model,
                rows,
                max_samples=settings.eval_max_samples,
            )
        else:
            evaluation = await asyncio.to_thread(_evaluate_policy_in_thread, settings, prepared, result)
        return {"eval_samples": float(evaluation.samples), **{f"eval_{k}": v for k, v in evaluation.metrics.items()}}

    async def _register(self, job_id: str, prepared: Prepared, adapter_uri: str, metrics: dict[str, float]) -> str:
        job = prepared.job
        async with self._sessions() as session:
            for row in await registry.list_policies(session, name=job.policy_name):
                if row.job_id == job_id:  # registered by an earlier attempt that died after it
                    return row.policy_id
            outcome = await registry.register(
                session,
                registration=registry.Registration(
                    name=job.policy_name,
                    kind=KIND_VALUES[job.kind],
                    base_model=job.base_model,
                    checkpoint_uri=adapter_uri,
                    dataset_uri=job.dataset_uri,
                    job_id=job_id,
                    parent_policy_id=job.parent_policy_id,
                    metrics=service.finite_metrics(metrics),
                ),
                actor=ACTOR,
                reason=f"trained by job {job_id}",
            )
        await self._events.publish(outcome.history)
        (row,) = outcome.policies.values()
        return row.policy_id

    async def _enrol(self, policy_id: str, endpoint: str, traffic_cap: float) -> tuple[str, str]:
        if self._canaries is None:
            return "", "not enrolled: no optimizer configured (FLYWHEEL_TRAINER_OPTIMIZER_ADDRESS)"
        try:
            arm_id = await self._canaries.enrol(
                policy_id=policy_id, endpoint=endpoint, traffic_cap=traffic_cap, actor=ACTOR
            )
        except Exception as exc:  # noqa: BLE001 - the version stays registered; enrol it by hand
            log.warning("canary enrolment failed", policy_id=policy_id, endpoint=endpoint, error=repr(exc))
            return "", f"trained and registered, but canary enrolment in {endpoint!r} failed: {exc}"
        return arm_id, f"canary arm {arm_id} of endpoint {endpoint}"


def _add_to_results(path: Path, extra: dict[str, Any]) -> bytes:
    """training_results.json with the job's lineage and held-out figures added."""
    payload = {**json.loads(path.read_text()), **extra}
    data = json.dumps(payload, indent=2, default=str).encode()
    path.write_bytes(data)
    return data


def reward_policy_problem(row: Any) -> str | None:
    """Why a registry version cannot serve as a GRPO/RLOO reward, or None."""
    if row.kind != jobs_pb2.TRAINING_KIND_REWARD_MODEL:
        return f"version {row.policy_id} is a {jobs_pb2.TrainingKind.Name(row.kind)}, not a reward model"
    if row.status in (int(Status.FAILED), int(Status.ROLLED_BACK)):
        return f"version {row.policy_id} is {jobs_pb2.PolicyStatus.Name(row.status)}"
    if not row.checkpoint_uri.startswith("s3://"):
        return f"version {row.policy_id} has no s3:// checkpoint"
    return None


def _training_figures(result: TrainResult) -> dict[str, float]:
    figures: dict[str, Any] = {
        "steps": result.global_step,
        "train_samples": result.dataset_rows,
        "runtime_s": result.runtime_s,
        "final_loss": result.final_loss,
        "final_reward": result.reward[-1]["value"] if result.reward else None,
        "final_kl": result.kl[-1]["value"] if result.kl else None,
        "flat_groups": result.flat_groups,
        "groups": result.groups,
    }
    return service.finite_metrics({k: v for k, v in figures.items() if v is not None})


def _evaluate_policy_in_thread(settings: TrainerSettings, prepared: Prepared, result: TrainResult) -> Any:
    """Generation is CPU/GPU-bound, so the whole evaluation runs off the service's loop, with
    its own loop for the judge's calls."""
    from flywheel.trainer.training import evaluate
    from flywheel.trainer.training.reward_sources import RewardSourceSpec, build_rewards

    async def run() -> Any:
        judge = judge_client(settings) if settings.judge_address else None
        metric_specs = [
            RewardSourceSpec(weight=1.0, exact_match_column=m.exact_match_column or None, callable=m.callable or None)
            for m in prepared.job.eval_metrics
        ]
        functions = build_rewards(metric_specs, judge=None, policy=settings.policy, base_model=prepared.base_model)
        metrics = [(f.label, f.fn) for f in functions]
        try:
            return await evaluate.evaluate_policy(
                result.adapter_dir,
                prepared.base_model,
                prepared.validation_rows,
                judge_rank=_rank(judge) if judge is not None else None,
                metrics=metrics,
                max_samples=settings.eval_max_samples,
                max_new_tokens=settings.eval_max_new_tokens,
            )
        finally:
            if judge is not None:
                await judge.close()

    return asyncio.run(run())


def _rank(judge: JudgeClient) -> Any:
    from flywheel.core.judge_client import JudgeUnavailable

    async def rank(prompt: str, responses: list[str]) -> list[float] | None:
        try:
            return await judge.rank(prompt=prompt, responses=responses, rubric="default")
        except JudgeUnavailable as exc:
            log.warning("judge unavailable during evaluation", error=str(exc))
            return None

    return rank
