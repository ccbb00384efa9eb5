"""The trainer reads what the trace store exports: a real ExportDataset on real servers (S3,
PostgreSQL, NATS), loaded back with ``flywheel.trainer.jobs.datasets.load_dataset`` through
``ObjectStore.get_object``; rows checked per kind and dry-run; a file changed after export is
refused by its sha256."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json

import grpc
import pytest
from pydantic import SecretStr

from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.core.objects import ObjectStore
from flywheel.core.settings import S3Settings
from flywheel.modelserver.tiny import build_tokenizer
from flywheel.trainer.jobs.datasets import DatasetError, check_rows, load_dataset, parse_manifest_uri
from flywheel.trainer.jobs.dry_run import estimate
from flywheel.trainer.training import TrainSpec

from .test_trace_store import s3_client
from .test_trace_store_export import export, ingest_examples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def object_store(env: dict[str, str]) -> ObjectStore:
    return ObjectStore(
        S3Settings(
            endpoint=env["FLYWHEEL_S3_ENDPOINT"],
            access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
            secret_key=SecretStr(env["FLYWHEEL_S3_SECRET_KEY"]),
            bucket_prefix=env["FLYWHEEL_S3_BUCKET_PREFIX"],
        )
    )


async def test_exports_load_back_verified_and_tampering_is_refused(launch):
    store = launch("trace_store")
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        await ingest_examples(stub)  # 12 prompts x 3 answers (rewards 0.9 / 0.5 / 0.1), one duplicate
        pref = await export(stub, pb.DATASET_KIND_PREFERENCE, min_margin=0.1)
        reward = await export(stub, pb.DATASET_KIND_REWARD)
    objects = object_store(store.env)

    # Preference export: the rows as written, provenance counted and dropped.
    loaded = await load_dataset(objects, pref.manifest_uri)
    assert (len(loaded.train), len(loaded.validation)) == (pref.train_rows, pref.validation_rows) == (9, 3)
    assert loaded.columns == {"prompt", "chosen", "rejected", "chosen_score", "rejected_score"}
    assert loaded.source_traces == len(loaded.manifest["source_traces"]) == 12 * 2 + 1  # best, worst, duplicate
    assert loaded.manifest["dataset_id"] == pref.dataset_id
    bucket, key = parse_manifest_uri(pref.manifest_uri)
    raw = await objects.get_object(bucket, key)
    assert loaded.manifest_sha256 == hashlib.sha256(raw).hexdigest()
    assert {r["prompt"] for r in loaded.train}.isdisjoint(r["prompt"] for r in loaded.validation)
    # 9 pairs are fewer than a job needs: the person is told so, not left with a failed run.
    with pytest.raises(ValueError, match="9 training rows, at least 10 are needed"):
        check_rows("dpo", loaded.train, loaded.validation)
    assert check_rows("dpo", loaded.train, loaded.validation, min_samples=9) == []

    # Reward export: prompt/response/score arrives as prompt/completion/score, which the
    # reward_model kind turns into pairs, and the dry run reads.
    scored = await load_dataset(objects, reward.manifest_uri)
    assert scored.columns == {"prompt", "completion", "score"}
    assert len(scored.train) + len(scored.validation) == 36
    assert check_rows("reward_model", scored.train, scored.validation) == []
    spec = TrainSpec(kind="reward_model", base_model="tiny", max_steps=4, batch_size=2, max_length=64)
    dry = estimate(spec, scored.train, scored.validation, tokenizer=build_tokenizer())
    assert dry.score_source == "score" and dry.score_stats["count"] == len(scored.train)
    assert dry.score_stats["min"] == pytest.approx(0.1) and dry.score_stats["max"] == pytest.approx(0.9)
    assert dry.validation_samples == len(scored.validation) and dry.mean_tokens > 0

    # A train file changed after export: refused, naming the object and both digests.
    manifest = json.loads(raw)
    train_key = next(f["key"] for f in manifest["files"] if f["split"] == "train")
    original = await objects.get_object(manifest["bucket"], train_key)
    tampered = original.replace(b"Hold the power button", b"Unplug it", 1)
    assert tampered != original
    client = s3_client(store.env)
    await asyncio.to_thread(client.put_object, manifest["bucket"], train_key, io.BytesIO(tampered), len(tampered))
    with pytest.raises(DatasetError, match=rf"{train_key}: sha256 [0-9a-f]{{64}} differs from the manifest's"):
        await load_dataset(objects, pref.manifest_uri)

    # Missing objects and the size cap, from ObjectStore.get_object up.
    with pytest.raises(DatasetError, match="no such object"):
        await load_dataset(objects, f"s3://{bucket}/preference/ds-gone/manifest.json")
    with pytest.raises(DatasetError, match="no such object"):
        await load_dataset(objects, "s3://no-such-bucket-here/x/manifest.json")
    with pytest.raises(FileNotFoundError):
        await objects.get_object(bucket, "nothing/here.json")
    with pytest.raises(ValueError, match="limit"):
        await objects.get_object(bucket, key, max_bytes=10)
    assert await objects.get_object(bucket, key, max_bytes=len(raw)) == raw
    with pytest.raises(DatasetError, match=r"train\.jsonl \(files\[0\]\): over the dataset's size limit \(10 bytes"):
        await load_dataset(objects, reward.manifest_uri, max_bytes=10)
