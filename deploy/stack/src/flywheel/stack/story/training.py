"""Stage 3: what the product's traces taught, plus the society's SAO pairs, become one
preference dataset; a DPO job with LoRA trains policy v1 on it, and the trainer enrols v1 as
a canary arm of the endpoint (served by the model server with its adapter).

The dataset: the trace store's preference export of the story's agent (pairs of answers to the
same question whose satisfaction rates differ by more than ``MIN_MARGIN``) and stage 1's SAO
dataset (the society's export), merged and registered through the society's ImportDataset.
Each record says where it came from in its ``persona`` field (the only free-text field a
registered record keeps): ``trace:<trace ids>`` or ``sao:<dataset id>[:<persona>]``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import grpc
import nats
from minio import Minio

from flywheel.api.society.v1 import society_service_pb2 as soc_pb
from flywheel.api.society.v1 import society_service_pb2_grpc as soc_grpc
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.trainer.v1 import events_pb2
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.stack.story.context import StoryContext
from flywheel.stack.story.traffic import retrying

MIN_MARGIN = 0.05  # chosen's satisfaction rate must beat rejected's by more than this
CANARY_CAP = 0.5  # most of the endpoint's traffic the canary may get
FINAL = (jobs.JOB_STATE_SUCCEEDED, jobs.JOB_STATE_FAILED, jobs.JOB_STATE_CANCELLED)
JOB_TIMEOUT_S = 420.0


class StageFailed(RuntimeError):
    """The stage cannot go on; the message says what happened."""


def trainer_base(served: str) -> str:
    """The trainer's base model for what the model server serves (an adapter must fit it)."""
    return "smollm2" if "smollm2" in served.lower() else "tiny"


def _s3(ctx: StoryContext) -> Minio:
    env = ctx.stack.servers.env()
    return Minio(
        env["FLYWHEEL_S3_ENDPOINT"],
        access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
        secret_key=env["FLYWHEEL_S3_SECRET_KEY"],
        secure=False,
    )


def read_manifest(ctx: StoryContext, uri: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A dataset's manifest and its rows (every split, in the manifest's order)."""
    client = _s3(ctx)
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    manifest = json.loads(client.get_object(bucket, key).read())
    rows: list[dict[str, Any]] = []
    for f in manifest["files"]:
        data = client.get_object(manifest.get("bucket") or bucket, f["key"]).read().decode()
        rows.extend(json.loads(line) for line in data.splitlines() if line.strip())
    return manifest, rows


def from_traces(rows: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    return [
        {
            "prompt": r["prompt"],
            "chosen": r["chosen"],
            "rejected": r["rejected"],
            "chosen_score": float(r.get("chosen_score", 0.0)),
            "rejected_score": float(r.get("rejected_score", 0.0)),
            "iteration": 0,
            "timestamp": now,
            "persona": "trace:" + ",".join(r.get("trace_ids", [])),
        }
        for r in rows
    ]


def from_sao(jsonl: bytes, dataset_id: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in jsonl.decode().splitlines() if line.strip()]
    for r in records:
        persona = r.get("persona") or ""
        r["persona"] = f"sao:{dataset_id}" + (f":{persona}" if persona else "")
    return records


def provenance(record: dict[str, Any]) -> str:
    """ "trace" or "sao": where a merged record came from."""
    return str(record.get("persona", "")).split(":", 1)[0]


async def export_traces(ctx: StoryContext, store: ts_grpc.TraceStoreServiceStub) -> ts_pb.ExportDatasetResponse | None:
    """The trace store's preference export of the story's agent; None when no two answers to
    one question differ enough (the SAO pairs may still make a dataset)."""
    try:
        return await retrying(lambda: _export(ctx, store))
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "no preference rows" in (exc.details() or ""):
            return None
        raise


async def _export(ctx: StoryContext, store: ts_grpc.TraceStoreServiceStub) -> ts_pb.ExportDatasetResponse:
    return await store.ExportDataset(
        ts_pb.ExportDatasetRequest(
            kind=ts_pb.DATASET_KIND_PREFERENCE,
            filter=ts_pb.QueryTracesRequest(agent=ctx.endpoint),
            validation_fraction=0.2,
            min_margin=MIN_MARGIN,
        )
    )


def job_spec(ctx: StoryContext, dataset_uri: str) -> jobs.TrainingJobSpec:
    spec = jobs.TrainingJobSpec(
        kind=jobs.TRAINING_KIND_DPO,
        base_model=trainer_base(ctx.served_model),
        dataset_uri=dataset_uri,
        lora=jobs.LoraSpec(r=8, alpha=16),
        endpoint=ctx.endpoint,
        policy_name=ctx.endpoint,
        canary_traffic_cap=CANARY_CAP,
    )
    spec.hyperparameters.update(
        {"max_steps": ctx.sizes.dpo_steps, "batch_size": 2, "max_length": 128, "learning_rate": 5e-4}
    )
    return spec


class Steps:
    """The job's steps as its progress events report them (a step reported twice, e.g. after
    a restarted trainer resumed from a checkpoint, keeps its last figures)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.by_step: dict[int, dict[str, Any]] = {}

    async def on_message(self, msg: Any) -> None:
        event = events_pb2.TrainingProgressEvent.FromString(msg.data)
        if event.job_id != self.job_id or event.step <= 0 or "loss" not in event.metrics:
            return
        m = dict(event.metrics)
        step: dict[str, Any] = {"step": int(event.step), "loss": m["loss"]}
        for out, key in (("reward_margin", "reward"), ("learning_rate", "learning_rate")):
            if key in m:
                step[out] = m[key]
        self.by_step[int(event.step)] = step

    def listed(self) -> list[dict[str, Any]]:
        return [self.by_step[s] for s in sorted(self.by_step)]


async def follow_job(ctx: StoryContext, trainer: pb_grpc.TrainerServiceStub, job_id: str) -> jobs.TrainingJob:
    """Poll the job to a final state, with a bar (step/total, loss); ``training.running`` is
    reached once a trainer picked it up."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    running = False
    with ctx.progress.bar("DPO job with LoRA (CPU)", ctx.sizes.dpo_steps) as bar:
        while True:
            job = (await retrying(lambda: trainer.GetJob(pb.GetJobRequest(job_id=job_id)))).job
            loss = job.metrics.get("loss")
            bar.update(
                completed=job.step,
                total=job.total_steps or ctx.sizes.dpo_steps,
                note=f"{jobs.JobState.Name(job.state).removeprefix('JOB_STATE_').lower()}"
                + (f" loss {loss:.3f}" if loss is not None else ""),
            )
            if job.state in FINAL:
                return job
            if job.state == jobs.JOB_STATE_RUNNING and not running:
                running = True
                await ctx.hooks.reached("training.running", ctx)
            if time.monotonic() > deadline:
                raise StageFailed(
                    f"job {job_id}: not finished after {JOB_TIMEOUT_S:.0f} s (state {jobs.JobState.Name(job.state)})"
                )
            await asyncio.sleep(0.5)


async def enrolled(trainer: pb_grpc.TrainerServiceStub, policy_id: str, timeout_s: float = 120.0) -> jobs.Policy:
    """The version once the trainer enrolled it as a canary arm."""
    deadline = time.monotonic() + timeout_s
    while True:
        policy = (await retrying(lambda: trainer.GetPolicy(pb.GetPolicyRequest(policy_id=policy_id)))).policy
        if policy.arm_id and policy.status != jobs.POLICY_STATUS_REGISTERED:
            return policy
        if policy.status == jobs.POLICY_STATUS_FAILED:
            raise StageFailed(f"policy {policy_id}: FAILED before serving (see the trainer's log)")
        if time.monotonic() > deadline:
            raise StageFailed(
                f"policy {policy_id}: not enrolled as a canary arm after {timeout_s:.0f} s "
                f"(status {jobs.PolicyStatus.Name(policy.status)})"
            )
        await asyncio.sleep(0.5)


async def train(ctx: StoryContext) -> None:
    """Stage 3: export → merge with SAO → register → DPO job → v1 as a canary arm; fills
    ``ctx.record.training`` and the lineage from traces to the arm."""
    began = time.monotonic()
    sao = (ctx.record.optimize or {}).get("sao") or {}
    async with AsyncExitStack() as exits:
        channel = exits.enter_async_context
        store = ts_grpc.TraceStoreServiceStub(await channel(grpc.aio.insecure_channel(ctx.address("trace_store"))))
        society = soc_grpc.SocietyServiceStub(await channel(grpc.aio.insecure_channel(ctx.address("society"))))
        trainer = pb_grpc.TrainerServiceStub(await channel(grpc.aio.insecure_channel(ctx.address("trainer"))))

        export = await export_traces(ctx, store)
        manifest, trace_rows = read_manifest(ctx, export.manifest_uri) if export else ({}, [])
        now = datetime.now(UTC).isoformat()
        records = from_traces(trace_rows, now)
        sao_records: list[dict[str, Any]] = []
        if sao.get("dataset_id"):
            got = await society.ExportDataset(soc_pb.ExportDatasetRequest(dataset_id=sao["dataset_id"]))
            sao_records = from_sao(got.jsonl, sao["dataset_id"])
        records += sao_records
        if not records:
            raise StageFailed("dataset: no preference pairs (the traces gave none and stage 1 kept no SAO pairs)")
        dataset_id = f"story-{uuid.uuid4().hex[:12]}"
        jsonl = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
        imported = (
            await society.ImportDataset(soc_pb.ImportDatasetRequest(dataset_id=dataset_id, jsonl=jsonl))
        ).dataset
        ctx.progress.say(
            f"dataset {dataset_id}: {len(trace_rows)} pairs from {export.source_traces if export else 0} traces + "
            f"{len(sao_records)} SAO pairs"
        )

        admin = ctx.stack.servers.env()  # the admin's NATS user: it may read progress events
        nc = await nats.connect(
            admin["FLYWHEEL_NATS_URL"], user=admin["FLYWHEEL_NATS_USER"], password=admin["FLYWHEEL_NATS_PASSWORD"]
        )
        exits.push_async_callback(nc.close)
        job = (await trainer.SubmitJob(pb.SubmitJobRequest(spec=job_spec(ctx, imported.manifest_uri)))).job
        steps = Steps(job.job_id)
        await nc.subscribe(Catalogue().training_progress(job.job_id), cb=steps.on_message)
        done = await follow_job(ctx, trainer, job.job_id)
        if done.state != jobs.JOB_STATE_SUCCEEDED:
            raise StageFailed(f"job {done.job_id}: {jobs.JobState.Name(done.state)}: {done.error}")
        await asyncio.sleep(0.3)  # the last progress events
        policy = await enrolled(trainer, done.policy_id)

    source_traces = list(
        manifest.get("source_traces") or sorted({t for r in trace_rows for t in r.get("trace_ids", [])})
    )
    ctx.record.training = {
        "seconds": round(time.monotonic() - began, 2),
        "trace_pairs": len(trace_rows),
        "sao_pairs": len(sao_records),
        "trace_dataset_id": export.dataset_id if export else None,
        "trace_dataset_uri": export.manifest_uri if export else None,
        "source_traces": source_traces,
        "sao_dataset_id": sao.get("dataset_id"),
        "dataset_id": imported.dataset_id,
        "dataset_manifest_uri": imported.manifest_uri,
        "dataset_rows": imported.train_rows + imported.validation_rows,
        "job_id": done.job_id,
        "job_state": jobs.JobState.Name(done.state),
        "job_attempts": done.attempts,
        "base_model": done.spec.base_model,
        "steps": steps.listed(),
        "job_step": done.step,
        "metrics": dict(done.metrics),
        "policy_id": policy.policy_id,
        "policy_name": policy.name,
        "version": policy.version,
        "policy_status": jobs.PolicyStatus.Name(policy.status),
        "arm_id": policy.arm_id,
        "served_model": policy.served_model,
    }
    lineage = ctx.record.lineage
    lineage.extend({"kind": "trace", "id": t, "from": []} for t in source_traces)
    parents = []
    if export is not None:
        lineage.append({"kind": "trace_dataset", "id": export.dataset_id, "from": source_traces})
        parents.append(export.dataset_id)
    if sao.get("dataset_id"):
        lineage.append({"kind": "sao_dataset", "id": sao["dataset_id"], "from": [sao.get("round_id") or ""]})
        parents.append(sao["dataset_id"])
    lineage.append({"kind": "dataset", "id": imported.dataset_id, "from": parents})
    lineage.append({"kind": "job", "id": done.job_id, "from": [imported.dataset_id]})
    lineage.append({"kind": "policy", "id": policy.policy_id, "from": [done.job_id]})
    lineage.append({"kind": "arm", "id": policy.arm_id, "from": [policy.policy_id]})
    ctx.progress.say(
        f"training: job {done.job_id} {len(ctx.record.training['steps'])} steps; "
        f"{policy.name} v{policy.version} is canary arm {policy.arm_id}"
    )
