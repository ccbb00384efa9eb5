"""Shared pieces of the training-job tests: datasets written to S3 as the trace store writes
them, and a client waiting on a job."""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import time
from typing import Any

import grpc
import pytest
from minio import Minio

from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.stack.servers import process_alive
from flywheel.stack.services import ServiceProcess
from flywheel.stack.testing import Launcher

FINAL = (jobs.JOB_STATE_SUCCEEDED, jobs.JOB_STATE_FAILED, jobs.JOB_STATE_CANCELLED)
CITIES = ["Paris", "Rome", "Madrid", "Berlin", "Lisbon", "Vienna", "Oslo", "Dublin", "Athens", "Warsaw"]
COUNTRIES = ["France", "Italy", "Spain", "Germany", "Portugal", "Austria", "Norway", "Ireland", "Greece", "Poland"]


def s3(env: dict[str, str]) -> Minio:
    return Minio(
        env["FLYWHEEL_S3_ENDPOINT"],
        access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
        secret_key=env["FLYWHEEL_S3_SECRET_KEY"],
        secure=False,
        region=env.get("FLYWHEEL_S3_REGION", "us-east-1"),
    )


def preference_rows(n: int, offset: int = 0) -> list[dict[str, Any]]:
    """Capital-city preference pairs: the city alone is chosen, a ramble rejected."""
    rows = []
    for i in range(offset, offset + n):
        country, city = COUNTRIES[i % len(COUNTRIES)], CITIES[i % len(CITIES)]
        rows.append(
            {
                "prompt": f"What is the capital of {country}? ({i})",
                "chosen": city,
                "rejected": f"I think it might be {CITIES[(i + 3) % len(CITIES)]}, but I am not sure.",
                "trace_ids": [f"t{i}"],
            }
        )
    return rows


def put_dataset(
    env: dict[str, str],
    name: str,
    train: list[dict[str, Any]],
    validation: list[dict[str, Any]],
    *,
    kind: str = "preference",
) -> str:
    """Write ``train``/``validation`` and their manifest as the trace store's export does;
    returns the manifest's s3:// URI."""
    client = s3(env)
    bucket = f"{env['FLYWHEEL_S3_BUCKET_PREFIX']}-datasets"
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    files = []
    for split, rows in (("train", train), ("validation", validation)):
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        key = f"{kind}/{name}/{split}.jsonl"
        client.put_object(bucket, key, io.BytesIO(data), len(data))
        files.append(
            {
                "split": split,
                "key": key,
                "rows": len(rows),
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
            }
        )
    manifest = {"dataset_id": name, "kind": kind, "format": "jsonl", "bucket": bucket, "files": files}
    data = json.dumps(manifest).encode()
    client.put_object(bucket, f"{kind}/{name}/manifest.json", io.BytesIO(data), len(data))
    return f"s3://{bucket}/{kind}/{name}/manifest.json"


def dpo_spec(dataset_uri: str, **hyperparameters: float) -> jobs.TrainingJobSpec:
    spec = jobs.TrainingJobSpec(
        kind=jobs.TRAINING_KIND_DPO, base_model="tiny", dataset_uri=dataset_uri, lora=jobs.LoraSpec(r=4, alpha=8)
    )
    spec.hyperparameters.update({"max_steps": 3, "batch_size": 2, "max_length": 64, **hyperparameters})
    return spec


async def wait_job(
    stub: pb_grpc.TrainerServiceStub, job_id: str, *, until: Any = None, timeout_s: float = 180.0
) -> jobs.TrainingJob:
    """Poll GetJob until ``until(job)`` (default: a final state)."""
    until = until or (lambda job: job.state in FINAL)
    deadline = time.monotonic() + timeout_s
    while True:
        job = (await stub.GetJob(pb.GetJobRequest(job_id=job_id))).job
        if until(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} did not get there in {timeout_s} s: {job}")
        await asyncio.sleep(0.2)


async def refused(call: Any, *words: str) -> str:
    """The call fails with INVALID_ARGUMENT whose details contain every word."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{err.value.code().name}: {details}"
    for word in words:
        assert word in details, details
    return details


# The session's job-running trainer (see ``warm_trainer``): fast polling and a short ack wait so
# cancels and kill -9 hand-overs happen in seconds, a small held-out evaluation, and canary
# versions followed every second (jobs naming an endpoint enrol on the session's optimizer).
WARM_TRAINER_ENV = {
    "FLYWHEEL_TRAINER_ACK_WAIT_S": "4",
    "FLYWHEEL_TRAINER_CANCEL_POLL_S": "0.3",
    "FLYWHEEL_TRAINER_EVAL_MAX_SAMPLES": "4",
    "FLYWHEEL_TRAINER_EVAL_MAX_NEW_TOKENS": "8",
    "FLYWHEEL_TRAINER_CANARY_FOLLOW_S": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
_warm: dict[tuple[int, str], ServiceProcess] = {}
_replicas = itertools.count(1)


def _alive(proc: ServiceProcess | None) -> bool:
    return proc is not None and proc.pid is not None and process_alive(proc.pid)


def session_optimizer(launcher: Launcher) -> ServiceProcess:
    """The optimizer of ``launcher`` (``launch_session``) the warm trainer enrols canaries on;
    started on first use."""
    proc = _warm.get((id(launcher), "optimizer"))
    if not _alive(proc):
        proc = launcher("optimizer")
        _warm[(id(launcher), "optimizer")] = proc
    return proc  # type: ignore[return-value]


def trainer_env(launcher: Launcher, replica: str) -> dict[str, str]:
    """A job-running trainer's variables (``WARM_TRAINER_ENV``, the session's optimizer) as
    replica ``replica``."""
    return {
        **WARM_TRAINER_ENV,
        "FLYWHEEL_TRAINER_OPTIMIZER_ADDRESS": session_optimizer(launcher).address,
        "FLYWHEEL_TRAINER_REPLICA_ID": replica,
        "FLYWHEEL_TRAINER_WORK_DIR": str(launcher.log_dir / f"work-{replica}"),
    }


def warm_trainer(launcher: Launcher) -> ServiceProcess:
    """The job-running trainer of ``launcher`` (``launch_session``), started on first use and
    again if a test killed it: its first job pays for importing torch, transformers and TRL
    (about half a minute on CI), the jobs of every later test do not. Tests using it share its
    schema, queue and optimizer, so they use names of their own and compare lists before/after."""
    proc = _warm.get((id(launcher), "trainer"))
    if not _alive(proc):
        proc = launcher("trainer", env=trainer_env(launcher, f"warm-{next(_replicas)}"))
        _warm[(id(launcher), "trainer")] = proc
    return proc  # type: ignore[return-value]


def adopt_warm_trainer(launcher: Launcher, proc: ServiceProcess) -> None:
    """``proc`` (a trainer of ``launcher``, e.g. the replica that took over from a killed one)
    is the warm trainer from now on."""
    _warm[(id(launcher), "trainer")] = proc


def replica_of(proc: ServiceProcess) -> str:
    return proc.env["FLYWHEEL_TRAINER_REPLICA_ID"]
