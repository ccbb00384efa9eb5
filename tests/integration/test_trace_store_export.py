"""Datasets out of the trace store: preference, SFT and reward-model exports land in S3 as
JSONL with a manifest, split by prompt, registered and announced; and TRL's DPOTrainer
trains one LoRA step on a tiny model from an exported preference dataset (the contract
with the trainer)."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import pytest

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1.events_pb2 import DatasetExportedEvent
from flywheel.api.traces.v1.spans_pb2 import SpanBatch

from .test_trace_store import agent_trace, s3_client

pytestmark = pytest.mark.integration

PROMPTS = [f"How do I reset device {i}?" for i in range(12)]
# Three answers per prompt with judge rewards 0.9 / 0.5 / 0.1; one exact duplicate trace.
ANSWERS = [("Hold the power button for ten seconds.", 0.9), ("Try turning it off.", 0.5), ("No idea.", 0.1)]


def read_json(env, bucket: str, key: str):
    resp = s3_client(env).get_object(bucket, key)
    try:
        data = resp.read().decode()
    finally:
        resp.close()
    return json.loads(data) if key.endswith(".json") else [json.loads(x) for x in data.splitlines()]


async def ingest_examples(stub) -> list[list]:
    traces = [agent_trace(p, a, r, agent="support") for p in PROMPTS for a, r in ANSWERS]
    traces.append(agent_trace(PROMPTS[0], ANSWERS[0][0], 0.7, agent="support"))  # same answer again
    requests = [
        pb.IngestRequest(batch=SpanBatch(meta=EventMeta(event_id=uuid.uuid4().hex), spans=spans)) for spans in traces
    ]
    replies = [r async for r in stub.Ingest(iter(requests))]
    assert sum(r.spans_stored for r in replies) == 5 * len(traces)
    return traces


async def export(stub, kind: int, **kw) -> pb.ExportDatasetResponse:
    return await stub.ExportDataset(
        pb.ExportDatasetRequest(
            kind=kind, filter=pb.QueryTracesRequest(agent="support"), validation_fraction=0.25, **kw
        )
    )


async def test_exports_are_split_by_prompt_with_manifest_and_event(launch, nats_client, isolation):
    store = launch("trace_store")
    js = nats_client.jetstream()
    announced = await js.pull_subscribe(
        f"{isolation['namespace']}.traces.dataset.>", stream=f"{isolation['namespace'].upper()}_DATASETS"
    )
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        traces = await ingest_examples(stub)
        by_id = {t[0].trace_id: t for t in traces}

        pref = await export(stub, pb.DATASET_KIND_PREFERENCE, min_margin=0.1)
        assert (pref.train_rows, pref.validation_rows) == (9, 3)  # one pair per prompt (best vs worst)
        bucket, key = pref.manifest_uri.removeprefix("s3://").split("/", 1)
        manifest = await asyncio.to_thread(read_json, store.env, bucket, key)
        assert manifest["dataset_id"] == pref.dataset_id and manifest["kind"] == "preference"
        files = {f["split"]: f for f in manifest["files"]}
        train = await asyncio.to_thread(read_json, store.env, bucket, files["train"]["key"])
        validation = await asyncio.to_thread(read_json, store.env, bucket, files["validation"]["key"])
        assert (len(train), len(validation)) == (files["train"]["rows"], files["validation"]["rows"]) == (9, 3)
        assert not {r["prompt"] for r in train} & {r["prompt"] for r in validation}  # no leakage
        for row in train + validation:
            assert row["chosen"] == ANSWERS[0][0] and row["rejected"] == ANSWERS[2][0]
            # Provenance: every trace id named really holds this prompt and one of the two answers.
            for tid in row["trace_ids"]:
                assert by_id[tid][0].input == row["prompt"]
                assert by_id[tid][3].output in (row["chosen"], row["rejected"])
        dup = next(r for r in train + validation if r["prompt"] == PROMPTS[0])
        assert len(dup["trace_ids"]) == 3 and dup["chosen_score"] == pytest.approx(0.8)  # deduplicated, averaged

        sft = await export(stub, pb.DATASET_KIND_SFT, min_reward=0.75)
        assert sft.train_rows + sft.validation_rows == 12  # only the best answer of each prompt
        reward = await export(stub, pb.DATASET_KIND_REWARD)
        assert reward.train_rows + reward.validation_rows == 36  # (prompt, response) pairs, deduplicated

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await export(stub, pb.DATASET_KIND_SFT, min_reward=0.99)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "lower min_reward" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ExportDataset(pb.ExportDatasetRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    events = [DatasetExportedEvent.FromString(m.data) for m in await announced.fetch(3, timeout=10)]
    assert [(e.dataset_id, e.train_rows) for e in events] == [
        (pref.dataset_id, 9),
        (sft.dataset_id, sft.train_rows),
        (reward.dataset_id, reward.train_rows),
    ]
    assert events[0].manifest_uri == pref.manifest_uri


def tiny_tokenizer(texts: list[str]):
    """A word-level tokenizer trained on the dataset itself (offline, milliseconds)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


async def test_dpo_trains_one_lora_step_on_an_exported_preference_dataset(launch, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    store = launch("trace_store")
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.TraceStoreServiceStub(channel)
        await ingest_examples(stub)
        pref = await export(stub, pb.DATASET_KIND_PREFERENCE, min_margin=0.1)
    bucket, key = pref.manifest_uri.removeprefix("s3://").split("/", 1)
    manifest = await asyncio.to_thread(read_json, store.env, bucket, key)
    train_key = next(f["key"] for f in manifest["files"] if f["split"] == "train")
    rows = await asyncio.to_thread(read_json, store.env, bucket, train_key)

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    tokenizer = tiny_tokenizer([r[k] for r in rows for k in ("prompt", "chosen", "rejected")])
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    args = DPOConfig(
        output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-2,
        report_to=[], save_strategy="no", use_cpu=True, max_length=64, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = DPOTrainer(
        model=LlamaForCausalLM(config),
        args=args,
        train_dataset=Dataset.from_list(rows),  # exactly what the trace store wrote, provenance columns included
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)  # only the adapter trains
    result = trainer.train()
    assert result.global_step == 1
    assert torch.isfinite(torch.tensor(result.training_loss))
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, trainable[n])]
    assert moved  # the LoRA weights changed
