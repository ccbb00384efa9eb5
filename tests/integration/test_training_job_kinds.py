"""Every job kind through the real trainer's queue, on a tiny model: reward model, SFT, DPO,
KTO, GRPO (an exact-match reward, and the reward model trained just before as a second
reward), SFT from a base model in S3, and RLOO each train two steps, checkpoint to S3 and register a version with its
lineage and held-out figures. A job whose data changes after it was accepted fails with the
reason in GetJob and in its progress events, and the trainer goes on with the next."""

from __future__ import annotations

import io

import grpc
import pytest

from flywheel.api.trainer.v1 import events_pb2
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc

from .trainer_jobs import CITIES, COUNTRIES, preference_rows, put_dataset, s3, wait_job, warm_trainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
K = jobs


def questions(n: int, offset: int = 0) -> list[dict]:
    return [
        {"prompt": f"Capital of {COUNTRIES[i % 10]}? ({i})", "answer": CITIES[i % 10]}
        for i in range(offset, offset + n)
    ]


def datasets(env: dict[str, str]) -> dict[str, str]:
    pairs = put_dataset(env, "pairs", preference_rows(12), preference_rows(3, offset=40))
    sft = put_dataset(
        env,
        "sft",
        [{"prompt": q["prompt"], "completion": q["answer"]} for q in questions(12)],
        [{"prompt": q["prompt"], "completion": q["answer"]} for q in questions(3, 40)],
        kind="sft",
    )
    kto_rows = [
        {"prompt": q["prompt"], "completion": q["answer"] if i % 2 else "No idea.", "label": bool(i % 2)}
        for i, q in enumerate(questions(16))
    ]
    kto = put_dataset(env, "kto", kto_rows[:12], kto_rows[12:], kind="kto")
    prompts = put_dataset(env, "prompts", questions(12), questions(3, 40), kind="prompts")
    return {"pairs": pairs, "sft": sft, "kto": kto, "prompts": prompts}


def upload_tiny_base(env: dict[str, str], folder) -> str:
    """The tiny base saved as a model folder and put in S3; its s3:// prefix."""
    from flywheel.trainer.training.models import load_for_training

    loaded = load_for_training("tiny", device="cpu")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    client = s3(env)
    bucket = f"{env['FLYWHEEL_S3_BUCKET_PREFIX']}-models"
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    for path in folder.iterdir():
        client.fput_object(bucket, f"tiny/{path.name}", str(path))
    return f"s3://{bucket}/tiny"


def spec(kind: int, dataset: str, name: str, **hyperparameters: float) -> jobs.TrainingJobSpec:
    out = jobs.TrainingJobSpec(
        kind=kind, base_model="tiny", dataset_uri=dataset, policy_name=name, lora=jobs.LoraSpec(r=4, alpha=8)
    )
    out.hyperparameters.update({"max_steps": 2, "batch_size": 2, "max_length": 48, "save_steps": 1, **hyperparameters})
    return out


async def test_every_kind_trains_checkpoints_and_registers_with_lineage(launch_session, nats_client, tmp_path):
    launch = launch_session
    trainer = warm_trainer(launch)  # the session's: shared with the other job tests, torch imported once
    data = datasets(launch.env)
    failures: list[events_pb2.TrainingProgressEvent] = []

    async def on_progress(msg) -> None:
        event = events_pb2.TrainingProgressEvent.FromString(msg.data)
        if event.state == K.JOB_STATE_FAILED:
            failures.append(event)

    sub = await nats_client.subscribe(f"{launch.isolation['namespace']}.trainer.progress.>", cb=on_progress)
    async with grpc.aio.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)

        async def run(job_spec: jobs.TrainingJobSpec) -> tuple[jobs.TrainingJob, jobs.Policy]:
            job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=job_spec))).job
            done = await wait_job(stub, job.job_id, timeout_s=300)
            assert done.state == K.JOB_STATE_SUCCEEDED, (jobs.TrainingKind.Name(job_spec.kind), done.error)
            assert done.step == 2 and done.checkpoint_uri.endswith("checkpoint-2"), done
            policy = (await stub.GetPolicy(pb.GetPolicyRequest(policy_id=done.policy_id))).policy
            assert (policy.kind, policy.job_id, policy.dataset_uri, policy.base_model) == (
                job_spec.kind,
                done.job_id,
                job_spec.dataset_uri,
                "tiny",
            )
            assert policy.checkpoint_uri == done.adapter_uri and policy.metrics["steps"] == 2
            return done, policy

        _, reward_model = await run(spec(K.TRAINING_KIND_REWARD_MODEL, data["pairs"], "rm"))
        assert 0 <= reward_model.metrics["eval_pairwise_accuracy"] <= 1
        await run(spec(K.TRAINING_KIND_SFT, data["sft"], "sft"))
        await run(spec(K.TRAINING_KIND_DPO, data["pairs"], "dpo"))
        await run(spec(K.TRAINING_KIND_KTO, data["kto"], "kto"))

        grpo = spec(K.TRAINING_KIND_GRPO, data["prompts"], "grpo", num_generations=2, max_completion_length=8)
        grpo.rewards.add(weight=1.0).verifiable.exact_match_column = "answer"
        grpo.rewards.add(weight=0.5).reward_policy_id = reward_model.policy_id
        grpo.eval_metrics.add().exact_match_column = "answer"
        done, policy = await run(grpo)
        assert "flat_groups" in done.metrics and done.metrics["groups"] >= 2  # flat groups are counted
        # The verifiable metric the job named, on the held-out prompts, for the adapter and its base.
        assert {"eval_exact_match:answer", "eval_exact_match:answer_base"} <= set(policy.metrics), policy.metrics

        # A base model from an S3 prefix (a model folder, as an operator uploads one).
        base_uri = upload_tiny_base(launch.env, tmp_path / "base")
        from_s3 = spec(K.TRAINING_KIND_SFT, data["sft"], "sft-s3")
        from_s3.base_model = base_uri
        dry = (await stub.SubmitJob(pb.SubmitJobRequest(spec=from_s3, dry_run=True))).dry_run
        assert dry.samples == 12 and dry.estimated_memory_bytes > 0  # config and tokenizer only
        job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=from_s3))).job
        done = await wait_job(stub, job.job_id, timeout_s=300)
        assert done.state == K.JOB_STATE_SUCCEEDED, done.error
        missing = spec(K.TRAINING_KIND_SFT, data["sft"], "sft-s3")
        missing.base_model = base_uri + "-nowhere"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJob(pb.SubmitJobRequest(spec=missing))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.base_model" in err.value.details()

        rloo = spec(K.TRAINING_KIND_RLOO, data["prompts"], "rloo", num_generations=2, max_completion_length=8)
        rloo.rewards.add(weight=1.0).verifiable.exact_match_column = "answer"
        await run(rloo)

        # Accepted, then its data changed before a trainer took it: FAILED, with the reason.
        slow = (await stub.SubmitJob(pb.SubmitJobRequest(spec=spec(K.TRAINING_KIND_SFT, data["sft"], "slow")))).job
        doomed = (await stub.SubmitJob(pb.SubmitJobRequest(spec=spec(K.TRAINING_KIND_DPO, data["pairs"], "x")))).job
        bucket, key = data["pairs"].removeprefix("s3://").split("/", 1)
        tampered = b'{"prompt": "p", "chosen": "a", "rejected": "b"}\n'
        s3(launch.env).put_object(
            bucket, key.replace("manifest.json", "train.jsonl"), io.BytesIO(tampered), len(tampered)
        )
        failed = await wait_job(stub, doomed.job_id, timeout_s=300)
        assert failed.state == K.JOB_STATE_FAILED and "sha256" in failed.error, failed
        assert any(e.job_id == doomed.job_id and "sha256" in e.message for e in failures)
        assert (await wait_job(stub, slow.job_id)).state == K.JOB_STATE_SUCCEEDED  # the trainer went on
    await sub.unsubscribe()
