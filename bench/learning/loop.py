"""The loop's own data path on the real local stack: each sampled answer is judged by the
reward judge service against the reference, published as a trace through the SDK (a
prompt span with the answer, a reward span with the judge's score), stored by the trace
store, and exported from there as a preference dataset (ExportDataset, kind preference).

Only the trace store and the reward judge run (plus NATS, PostgreSQL and S3). The judge's
MiniLM embeddings are switched off (``FLYWHEEL_REWARD_JUDGE_EMBEDDINGS=false``): its
reference judge then scores max(exact match, token F1) against the reference, a verifiable
reward ("Paris" 1.0, "The capital of France is Paris." 0.33, a wrong city 0)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from flywheel.api.reward.v1 import reward_judge_service_pb2 as judge_pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as judge_grpc
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.traces.v1.spans_pb2 import SpanKind
from flywheel.sdk.tracing import Tracer, reward
from flywheel.stack.stack import Stack

AGENT = "capitals-bench"


@dataclass
class Sample:
    prompt: str
    reference: str
    completion: str
    arm: str = "plain"  # which prompt variant produced it: "plain" or "few_shot"
    score: float = 0.0


def start_stack(root: Path) -> Stack:
    stack = Stack.create(root, services=("trace_store", "reward_judge"))
    stack.services["reward_judge"].env["FLYWHEEL_REWARD_JUDGE_EMBEDDINGS"] = "false"
    stack.up(timeout_s=120)
    return stack


async def judge(stack: Stack, samples: list[Sample], *, concurrency: int = 16) -> None:
    """Score every sample with the reward judge's reference judge (Score RPC), in place."""
    sem = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(stack.services["reward_judge"].address) as channel:
        stub = judge_grpc.RewardJudgeServiceStub(channel)

        async def one(s: Sample) -> None:
            async with sem:
                resp = await stub.Score(
                    judge_pb.ScoreRequest(
                        prompt=s.prompt,
                        response=s.completion,
                        reference=s.reference,
                        judge=judge_pb.JUDGE_KIND_REFERENCE,
                    ),
                    timeout=60,
                )
            s.score = resp.judgement.score

        await asyncio.gather(*(one(s) for s in samples))


def publish(stack: Stack, samples: list[Sample]) -> None:
    """One trace per sample through the SDK, as a product would send it; blocks until
    JetStream has stored every span."""
    env = stack.servers.env(nats_role="product")
    tracer = Tracer(
        nats_url=env["FLYWHEEL_NATS_URL"],
        nats_user=env["FLYWHEEL_NATS_USER"],
        nats_password=env["FLYWHEEL_NATS_PASSWORD"],
        namespace=env["FLYWHEEL_NATS_NAMESPACE"],
        agent=AGENT,
        source="bench-learning",
    )
    try:
        for s in samples:
            with tracer.trace(
                "capital question", input=s.prompt, kind=SpanKind.SPAN_KIND_PROMPT, attributes={"arm": s.arm}
            ) as p:
                p.model = "smollm2-135m-instruct"
                p.output = s.completion
                reward(s.score, name="reward_judge:reference", tracer=tracer)
        lost = tracer.flush(timeout_s=60)
        if lost:
            raise RuntimeError(f"{lost} spans were dropped while publishing the traces")
    finally:
        tracer.close()


async def _count_traces(stub: ts_grpc.TraceStoreServiceStub) -> int:
    count, token = 0, ""
    while True:
        resp = await stub.QueryTraces(
            ts_pb.QueryTracesRequest(agent=AGENT, page={"page_size": 1000, "page_token": token})
        )
        count += len(resp.traces)
        token = resp.next_page_token
        if not token:
            return count


async def export_preferences(stack: Stack, expected_traces: int, *, min_margin: float) -> tuple[list[dict], dict]:
    """Wait until the trace store holds every trace, export the preference dataset and read
    its rows (train and the export's own validation split: both come from the bench's
    training prompts) back from S3. Returns (rows, export summary)."""
    async with grpc.aio.insecure_channel(stack.services["trace_store"].address) as channel:
        stub = ts_grpc.TraceStoreServiceStub(channel)
        deadline = time.monotonic() + 120
        while (stored := await _count_traces(stub)) < expected_traces:
            if time.monotonic() > deadline:
                raise TimeoutError(f"trace store holds {stored} of {expected_traces} traces after 120 s")
            await asyncio.sleep(0.5)
        resp = await stub.ExportDataset(
            ts_pb.ExportDatasetRequest(
                kind=ts_pb.DATASET_KIND_PREFERENCE,
                filter=ts_pb.QueryTracesRequest(agent=AGENT),
                min_margin=min_margin,
            )
        )
    from minio import Minio

    env = stack.servers.env()
    s3 = Minio(
        env["FLYWHEEL_S3_ENDPOINT"],
        access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
        secret_key=env["FLYWHEEL_S3_SECRET_KEY"],
        secure=False,
        region="us-east-1",
    )

    def read(bucket: str, key: str) -> bytes:
        obj = s3.get_object(bucket, key)
        try:
            return obj.read()
        finally:
            obj.close()

    bucket, key = resp.manifest_uri.removeprefix("s3://").split("/", 1)
    manifest = json.loads(read(bucket, key))
    rows = []
    for f in manifest["files"]:
        rows += [json.loads(line) for line in read(bucket, f["key"]).decode().splitlines() if line]
    summary = {
        "dataset_id": resp.dataset_id,
        "manifest_uri": resp.manifest_uri,
        "train_rows": resp.train_rows,
        "validation_rows": resp.validation_rows,
        "source_traces": resp.source_traces,
    }
    return rows, summary
