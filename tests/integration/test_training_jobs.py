"""Training jobs through the real trainer process, on real NATS, PostgreSQL and S3, with a
tiny model: a DPO job trains, uploads its adapter, is evaluated on the held-out split and
registers a version with its lineage, reporting progress on the bus; a dry run queues
nothing; bad jobs are refused naming the field; a cancelled job stops and keeps its
checkpoint; a trainer killed with kill -9 mid-job hands the job to another replica, which
resumes from the checkpoint in S3 (the step counter continues). The tests share the session's
warm trainer (``warm_trainer``: one process pays for importing torch), each with its own
datasets, names and jobs; the kill -9 test kills it and hands the role to its successor."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from flywheel.api.trainer.v1 import events_pb2
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc

from .trainer_jobs import (
    adopt_warm_trainer,
    dpo_spec,
    preference_rows,
    put_dataset,
    refused,
    replica_of,
    s3,
    trainer_env,
    wait_job,
    warm_trainer,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def progress_events(nats_client, ns: str) -> tuple[list[events_pb2.TrainingProgressEvent], object]:
    """Every progress event of the namespace from now on (filter by job: the trainer is shared)."""
    seen: list[events_pb2.TrainingProgressEvent] = []

    async def on_message(msg) -> None:
        event = events_pb2.TrainingProgressEvent()
        event.ParseFromString(msg.data)
        seen.append(event)

    sub = await nats_client.subscribe(f"{ns}.trainer.progress.>", cb=on_message)
    return seen, sub


async def test_dpo_job_trains_evaluates_registers_and_reports(launch_session, nats_client):
    launch = launch_session
    trainer = warm_trainer(launch)
    ns = launch.isolation["namespace"]
    uri = put_dataset(launch.env, "dpo-small", preference_rows(12), preference_rows(4, offset=100))
    seen, sub = await progress_events(nats_client, ns)
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        spec = dpo_spec(uri, max_steps=3)
        spec.policy_name = "capitals-dpo"
        submitted = (await stub.SubmitJob(pb.SubmitJobRequest(spec=spec))).job
        assert submitted.state == jobs.JOB_STATE_QUEUED and submitted.total_steps == 3
        job = await wait_job(stub, submitted.job_id)
        assert job.state == jobs.JOB_STATE_SUCCEEDED, job.error
        assert (job.step, job.attempts, job.worker) == (3, 1, replica_of(trainer))
        assert job.adapter_uri.endswith(f"jobs/{job.job_id}/adapter") and job.policy_id
        # Held-out figures and training figures are stored with the job and the version.
        assert job.metrics["eval_samples"] == 4 and "final_loss" in job.metrics, dict(job.metrics)
        policy = (await stub.GetPolicy(pb.GetPolicyRequest(policy_id=job.policy_id))).policy
        assert (policy.name, policy.version, policy.job_id, policy.dataset_uri) == ("capitals-dpo", 1, job.job_id, uri)
        assert policy.kind == jobs.TRAINING_KIND_DPO and policy.checkpoint_uri == job.adapter_uri
        assert policy.metrics["steps"] == 3 and "eval_samples" in policy.metrics
        # The state filter: this job is listed, and only succeeded jobs are (the trainer is shared).
        listed = (await stub.ListJobs(pb.ListJobsRequest(state=jobs.JOB_STATE_SUCCEEDED))).jobs
        assert job.job_id in [j.job_id for j in listed]
        assert {j.state for j in listed} == {jobs.JOB_STATE_SUCCEEDED}
    await sub.unsubscribe()
    # The adapter (with its tokenizer) and training_results.json are in S3.
    bucket, prefix = job.adapter_uri.removeprefix("s3://").split("/", 1)
    keys = {o.object_name.rsplit("/", 1)[-1] for o in s3(launch.env).list_objects(bucket, prefix + "/", recursive=True)}
    assert {"adapter_config.json", "adapter_model.safetensors", "_COMPLETE"} <= keys
    results = s3(launch.env).get_object(bucket, f"jobs/{job.job_id}/training_results.json").read()
    assert b"manifest_sha256" in results and b'"packages"' in results
    # Progress on the bus: every step with its loss, then SUCCEEDED naming the version.
    seen = [e for e in seen if e.job_id == job.job_id]
    steps = [e.step for e in seen if e.state == jobs.JOB_STATE_RUNNING and "loss" in e.metrics]
    assert steps == [1, 2, 3], [(e.state, e.step, e.message) for e in seen]
    assert seen[-1].state == jobs.JOB_STATE_SUCCEEDED and job.policy_id in seen[-1].message


async def test_dry_run_estimates_and_queues_nothing_and_bad_jobs_are_refused(launch_session, nats_client):
    launch = launch_session
    trainer = warm_trainer(launch)
    good = put_dataset(launch.env, "good", preference_rows(12), preference_rows(3, offset=50))
    few = put_dataset(launch.env, "few", preference_rows(5), [])
    empty = put_dataset(launch.env, "empty", [], [])
    wrong = put_dataset(launch.env, "wrong", [{"question": "q", "answer": "a"}] * 12, [])
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        stream = f"{launch.isolation['namespace'].upper()}_TRAINING_JOBS"
        stored = (await stub.ListJobs(pb.ListJobsRequest())).jobs
        queued = (await nats_client.jetstream().stream_info(stream)).state.messages
        dry = (await stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(good, max_steps=6), dry_run=True))).dry_run
        assert (dry.samples, dry.validation_samples, dry.estimated_steps) == (12, 3, 6)
        assert dry.estimated_seconds > 0 and dry.estimated_memory_bytes > 0 and dry.mean_tokens > 0
        assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == stored  # nothing stored
        assert (await nats_client.jetstream().stream_info(stream)).state.messages == queued  # nothing queued

        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(wrong))), "spec.dataset_uri", "chosen")
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(empty))), "spec.dataset_uri")
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(few))), "spec.dataset_uri", "10")
        missing = dpo_spec(good)
        missing.base_model = "/no/such/model"
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=missing)), "spec.base_model")
        missing.base_model = "/etc"  # exists, but is no place a model may come from
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=missing)), "spec.base_model", "outside")
        await refused(
            stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(good, learning_rate=float("nan")))),
            "spec.hyperparameters.learning_rate",
        )
        await refused(
            stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(good, batch_size=-2))), "spec.hyperparameters.batch_size"
        )
        grpo = jobs.TrainingJobSpec(kind=jobs.TRAINING_KIND_GRPO, base_model="tiny", dataset_uri=good)
        grpo.reward_policy_id = "no-such-version"
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=grpo)), "spec.reward_policy_id", "no-such-version")
        await refused(stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec("http://x/y"))), "spec.dataset_uri")
        await refused(stub.SubmitJob(pb.SubmitJobRequest()), "spec")
        # The trainer keeps serving after all of that, and none of it stored a job.
        assert (await stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(good), dry_run=True))).dry_run.samples == 12
        assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == stored


async def test_cancel_stops_a_running_job_and_keeps_its_checkpoint(launch_session):
    launch = launch_session
    trainer = warm_trainer(launch)
    uri = put_dataset(launch.env, "long", preference_rows(20), [])
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(uri, max_steps=2000, save_steps=2)))).job
        await wait_job(stub, job.job_id, until=lambda j: j.checkpoint_uri != "" and j.step >= 3)
        asked = (await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id))).job
        assert asked.cancel_requested and asked.state == jobs.JOB_STATE_RUNNING
        done = await wait_job(stub, job.job_id, timeout_s=60)
        assert done.state == jobs.JOB_STATE_CANCELLED and 3 <= done.step < 2000
        assert done.checkpoint_uri.endswith(f"checkpoint-{done.step}") and not done.policy_id
        # A finished job cannot be cancelled again; a queued one is cancelled at once.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert not (await stub.ListJobs(pb.ListJobsRequest(state=jobs.JOB_STATE_RUNNING))).jobs


async def test_kill_9_mid_job_resumes_on_another_trainer_from_its_checkpoint(launch_session, nats_client):
    launch = launch_session
    first = warm_trainer(launch)  # already past its first job's imports when run after the others
    ns = launch.isolation["namespace"]
    uri = put_dataset(launch.env, "resume", preference_rows(20), [])
    seen, sub = await progress_events(nats_client, ns)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=dpo_spec(uri, max_steps=12, save_steps=4)))).job
        running = await wait_job(stub, job.job_id, until=lambda j: j.checkpoint_uri != "")
    first.kill()  # SIGKILL: no drain, no ack
    saved = int(running.checkpoint_uri.rsplit("-", 1)[-1])
    assert saved >= 4
    second = launch("trainer", env=trainer_env(launch, "b"))
    adopt_warm_trainer(launch, second)  # the session's job-running trainer from now on
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        done = await wait_job(stub, job.job_id, timeout_s=180)
    await sub.unsubscribe()
    assert done.state == jobs.JOB_STATE_SUCCEEDED, done.error
    assert (done.attempts, done.worker, done.step) == (2, "b", 12)
    seen = [e for e in seen if e.job_id == job.job_id]
    resumed = [e for e in seen if e.meta.source == "trainer/b" and "resumed" in e.message]
    assert resumed, [(e.meta.source, e.message) for e in seen if e.message]
    b_steps = [e.step for e in seen if e.meta.source == "trainer/b" and "loss" in e.metrics]
    # The step counter continued from the checkpoint instead of starting again at 1.
    assert b_steps and min(b_steps) > saved >= 4 and max(b_steps) == 12, b_steps
    await asyncio.sleep(0)
