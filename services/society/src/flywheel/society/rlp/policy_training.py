"""Training the reasoning policy of a search space on its experience buffer (GRPO in the
trainer), and switching the space's runs to the adapter it produces.

Once a space's buffer holds ``rlp_train_min_experiences`` experiences (and again after as many
new ones), the buffered contexts and their observed outcomes are written to S3 in the trace
store's export format (``rlp/<dataset_id>/{train,validation}.jsonl`` + ``manifest.json``,
columns ``prompt`` = the context, ``outcome`` = what happened) and a GRPO job is submitted
whose reward is the information gain of each sampled thought about that outcome (KL beta 0,
as in the paper). A background task follows the job; when it succeeded, the version it
registered is loaded into the model server as ``<name>-v<version>`` (the trainer's own
served-name rule) and becomes the space's ``policy_model``: the next steps of every run on
the space reason with it.

The jobs of a space are recorded in ``rlp_policies.normalizer["jobs"]`` (job id, buffer size,
state, adapter), beside the reward normaliser's state."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from google.protobuf import struct_pb2
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.logging import get_logger
from flywheel.society.models import RlpExperienceRow, RlpPolicyRow
from flywheel.society.rlp import buffer
from flywheel.society.rlp.config import RLPConfig
from flywheel.society.settings import SocietySettings

log = get_logger(__name__)
PURPOSE = "datasets"
KIND = "rlp"
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
VALIDATION_FRACTION = 0.1


def policy_name(space_fingerprint: str) -> str:
    """The registry name of a space's reasoning policy (a subject token)."""
    return f"rlp-{space_fingerprint[:16]}"


def served_name(policy: Any) -> str:
    """The model name a registered version is served under (the trainer's rule)."""
    return policy.served_model or f"{policy.name}-v{policy.version}"


def jobs_of(row: RlpPolicyRow) -> list[dict[str, Any]]:
    """The space's GRPO jobs, oldest first (copies: a changed list must be assigned back,
    since the JSON column sees no change made in place)."""
    return [dict(job) for job in (row.normalizer or {}).get("jobs") or []]


def grpo_rows(experiences: list[tuple[str, str]]) -> list[dict[str, str]]:
    """One row per distinct (context, outcome): the GRPO job samples its own thoughts."""
    seen, rows = set(), []
    for context, outcome in experiences:
        if (context, outcome) in seen or not context.strip() or not outcome.strip():
            continue
        seen.add((context, outcome))
        rows.append({"prompt": context, "outcome": outcome})
    return rows


def split_rows(rows: list[dict[str, str]], fraction: float) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Train/validation by prompt (no prompt in both), prompts ordered by their sha256."""
    groups: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault(r["prompt"], []).append(r)
    keys = sorted(groups, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    n_val = min(math.ceil(fraction * len(keys)), max(len(keys) - 1, 0))
    return [r for k in keys[n_val:] for r in groups[k]], [r for k in keys[:n_val] for r in groups[k]]


async def publish_dataset(objects: Any, dataset_id: str, rows: list[dict[str, str]], *, space: str) -> str:
    """Write the rows in the trace store's export format; returns the manifest's s3:// URI."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", dataset_id):
        raise ValueError(f"dataset_id {dataset_id!r}: letters, digits, '.', '_' and '-' only")
    train, validation = split_rows(rows, VALIDATION_FRACTION)
    await objects.ensure_bucket(PURPOSE)
    prefix = f"{KIND}/{dataset_id}"
    files = []
    for split, part in (("train", train), ("validation", validation)):
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part).encode()
        key = f"{prefix}/{split}.jsonl"
        await objects.put_bytes(PURPOSE, key, data, content_type="application/x-ndjson")
        files.append(
            {
                "split": split,
                "key": key,
                "rows": len(part),
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
            }
        )
    manifest = {
        "dataset_id": dataset_id,
        "kind": KIND,
        "source": "society.rlp",
        "created_at": datetime.now(UTC).isoformat(),
        "format": "jsonl",
        "bucket": objects.bucket(PURPOSE),
        "files": files,
        "params": {"space_fingerprint": space},
        "split": "by prompt: no prompt is in both train and validation",
        "source_traces": [],
    }
    return await objects.put_bytes(
        PURPOSE, f"{prefix}/manifest.json", json.dumps(manifest, indent=1).encode(), content_type="application/json"
    )


def grpo_spec(*, base_model: str, dataset_uri: str, space: str, rlp: RLPConfig) -> jobs_pb2.TrainingJobSpec:
    """The GRPO job: reward = information gain about the ``outcome`` column, KL beta 0."""
    hp = struct_pb2.Struct()
    hp.update(
        {
            "beta": 0.0,
            "epochs": 1,
            "num_generations": max(2, min(rlp.num_thoughts, 8)),
            "max_completion_length": min(rlp.thought_length, 256),
            "temperature": max(rlp.temperature, 0.1),
        }
    )
    return jobs_pb2.TrainingJobSpec(
        kind=jobs_pb2.TRAINING_KIND_GRPO,
        base_model=base_model,
        dataset_uri=dataset_uri,
        hyperparameters=hp,
        policy_name=policy_name(space),
        rewards=[
            jobs_pb2.RewardSource(weight=1.0, information_gain=jobs_pb2.InformationGainReward(outcome_column="outcome"))
        ],
    )


class PolicyTraining:
    """Submits a space's GRPO jobs and follows them (``follow`` is a background task)."""

    def __init__(
        self,
        *,
        settings: SocietySettings,
        sessions: async_sessionmaker[AsyncSession],
        trainer: Any,
        objects: Any,
        load_adapter: Callable[[str, str], Awaitable[None]] | None = None,
        poll_s: float = 15.0,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._trainer = trainer
        self._objects = objects
        self._load_adapter = load_adapter or (self._load_into_model_server if settings.modelserver_url else None)
        self._poll_s = poll_s

    @property
    def enabled(self) -> bool:
        s = self._settings
        return (
            s.rlp_train_min_experiences > 0
            and bool(s.rlp_train_base_model)
            and self._trainer is not None
            and bool(getattr(self._trainer, "configured", True))
            and self._objects is not None
        )

    async def maybe_train(self, space: str, rlp: RLPConfig) -> str | None:
        """Submit a GRPO job when the space's buffer has grown by ``rlp_train_min_experiences``
        since the last one (and none is running); returns the job id, or None."""
        if not self.enabled:
            return None
        need = self._settings.rlp_train_min_experiences
        async with self._sessions() as session, session.begin():
            row = await buffer.policy_for_update(session, space)
            size = await buffer.buffer_size(session, space)
            jobs = jobs_of(row)
            if size < need or size - row.trained_at_size < need:
                return None
            if jobs and jobs[-1].get("state") not in TERMINAL:
                return None  # one job per space at a time
            got = await session.execute(
                select(RlpExperienceRow.context, RlpExperienceRow.outcome)
                .where(RlpExperienceRow.space_fingerprint == space)
                .order_by(RlpExperienceRow.id)
            )
            rows = grpo_rows([(c, o) for c, o in got])
            dataset_id = f"rlp-{space[:16]}-{size}-{datetime.now(UTC):%Y%m%d%H%M%S}"
            uri = await publish_dataset(self._objects, dataset_id, rows, space=space)
            spec = grpo_spec(base_model=self._settings.rlp_train_base_model, dataset_uri=uri, space=space, rlp=rlp)
            submitted = await self._trainer.submit(spec)
            job_id = submitted.job.job_id
            row.training_job_id = job_id
            row.trained_at_size = size
            row.normalizer = {
                **(row.normalizer or {}),
                "jobs": [*jobs, {"job_id": job_id, "size": size, "dataset_uri": uri, "state": "JOB_STATE_QUEUED"}],
            }
        log.info("rlp policy training submitted", space=space, job_id=job_id, experiences=size, rows=len(rows))
        return job_id

    async def follow_once(self) -> int:
        """Look at every space's unfinished job once; returns how many changed state."""
        async with self._sessions() as session:
            rows = list((await session.scalars(select(RlpPolicyRow).where(RlpPolicyRow.training_job_id != ""))).all())
        changed = 0
        for row in rows:
            jobs = jobs_of(row)
            if not jobs or jobs[-1].get("state") in TERMINAL:
                continue
            job = await self._trainer.get_job(jobs[-1]["job_id"])
            state = jobs_pb2.JobState.Name(job.state)
            if state == jobs[-1].get("state"):
                continue
            adapter = ""
            if state == "JOB_STATE_SUCCEEDED" and job.policy_id:
                policy = await self._trainer.get_policy(job.policy_id)
                adapter = served_name(policy)
                if not policy.served_model and self._load_adapter is not None:
                    await self._load_adapter(adapter, policy.checkpoint_uri)
            await self._record(row.space_fingerprint, jobs[-1]["job_id"], state, adapter, job.error)
            changed += 1
        return changed

    async def follow(self) -> None:
        """Follow jobs forever (a background task of the service)."""
        while True:
            try:
                if self.enabled:
                    await self.follow_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the trainer or PostgreSQL away: next time
                log.warning("following rlp training jobs failed", error=repr(exc))
            await asyncio.sleep(self._poll_s)

    async def _record(self, space: str, job_id: str, state: str, adapter: str, error: str) -> None:
        async with self._sessions() as session, session.begin():
            row = await buffer.policy_for_update(session, space)
            jobs = jobs_of(row)
            for job in jobs:
                if job.get("job_id") == job_id:
                    job.update({"state": state, "adapter": adapter, "error": error[:500]})
            row.normalizer = {**(row.normalizer or {}), "jobs": jobs}
            if adapter:
                row.policy_model = adapter
                row.updated_at = func.now()
        log.info("rlp policy training job", space=space, job_id=job_id, state=state, adapter=adapter)

    async def _load_into_model_server(self, name: str, checkpoint_uri: str) -> None:
        root = self._settings.modelserver_url.rstrip("/").removesuffix("/v1")
        key = self._settings.modelserver_api_key
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        async with httpx.AsyncClient(base_url=root, headers=headers, timeout=300.0) as client:
            resp = await client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": checkpoint_uri})
        if resp.status_code != 200 and "lora_already_loaded" not in resp.text:
            raise RuntimeError(f"model server refused to load {name}: HTTP {resp.status_code}: {resp.text[:200]}")
