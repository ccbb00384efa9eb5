"""The society as a real service: an SAO round started over gRPC runs in the service's worker
against a scripted policy model (a real local OpenAI-compatible server, through LiteLLM) and
the real reward judge process (both orders; its LLM scripted to change its mind on two
prompts), registers its dataset in S3 and PostgreSQL, announces it on the bus, submits its DPO
job to the real trainer (which reads and accepts the manifest), and shows
in ListDatasets, GetStats and /metrics. Imports refuse a malformed line by number, exports
round-trip, and hostile requests are INVALID_ARGUMENT naming the field.

The script's counts (sao_stubs): 18 persona prompts, 16 unique, plus 2 real prompts of the
endpoint from a trace store (a fake one speaking gRPC); dropped duplicate_prompt 2,
unparsable_ranking 1, judge_order_disagreement 2; 17 judged, 15 kept (13 train, 2 validation)."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import httpx
import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.society.v1 import events_pb2 as society_events
from flywheel.api.society.v1 import society_service_pb2 as pb
from flywheel.api.society.v1 import society_service_pb2_grpc as pb_grpc
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.api.trainer.v1 import trainer_service_pb2 as trainer_pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as trainer_grpc

from .sao_stubs import Stub, judge_llm, policy_answers, start_judge_args, trainer_env  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TRACE_PROMPTS = ["How do I reset my router's admin password?", "What is the refund window for a damaged parcel?"]


class TraceStore(ts_grpc.TraceStoreServiceServicer):
    """A trace store answering QueryTraces for the endpoint "support" in two pages (a repeated
    task and an empty one among them); a real gRPC server in the test process."""

    def __init__(self) -> None:
        self.endpoints: list[str] = []
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def QueryTraces(self, request, context):
        self.endpoints.append(request.endpoint)
        if request.page.page_token == "":
            tasks, token = [TRACE_PROMPTS[0], "  how do I reset my ROUTER's admin password?", ""], "p2"
        else:
            tasks, token = [TRACE_PROMPTS[1]], ""
        return ts_pb.QueryTracesResponse(
            traces=[ts_pb.TraceSummary(trace_id=f"t{i}", endpoint="support", task=t) for i, t in enumerate(tasks)],
            next_page_token=token,
        )

    async def start(self) -> TraceStore:
        self.server = grpc.aio.server()
        ts_grpc.add_TraceStoreServiceServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        return self


def config(**fields: object) -> Struct:
    out = Struct()
    out.update(fields)
    return out


async def refused(call, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == code, details
    for word in words:
        assert word in details, details
    return details


async def finished_round(stub: pb_grpc.SocietyServiceStub, round_id: str, timeout_s: float = 60) -> pb.SaoRound:
    deadline = time.monotonic() + timeout_s
    while True:
        got = (await stub.GetSaoRound(pb.GetSaoRoundRequest(round_id=round_id))).round
        if got.state in ("succeeded", "failed"):
            return got
        assert time.monotonic() < deadline, f"round still {got.state} after {timeout_s} s"
        await asyncio.sleep(0.2)


async def test_society_service_runs_sao_end_to_end(launch, judge_llm, nats_client, tmp_path):  # noqa: F811
    # Started without waiting, so each starts while the next migrates.
    judge = launch(**start_judge_args(judge_llm), wait=False)
    trainer = launch("trainer", env={**trainer_env(tmp_path), "FLYWHEEL_TRAINER_RUN_JOBS": "false"}, wait=False)
    policy = await Stub(policy_answers()).start()
    traces = await TraceStore().start()
    try:
        society = launch(
            "society",
            env={
                "FLYWHEEL_LLM_MODEL": "openai/policy",
                "FLYWHEEL_LLM_API_BASE": policy.url,
                "FLYWHEEL_LLM_API_KEY": "sk-scripted",
                "FLYWHEEL_LLM_TIMEOUT_S": "10",
                "FLYWHEEL_SOCIETY_JUDGE_ADDRESS": judge.address,
                "FLYWHEEL_SOCIETY_TRAINER_ADDRESS": trainer.address,
                "FLYWHEEL_SOCIETY_TRACE_STORE_ADDRESS": traces.address,
                "FLYWHEEL_SOCIETY_SAO_TRAIN_THRESHOLD": "10",
                "FLYWHEEL_SOCIETY_SAO_TRAIN_BASE_MODEL": "tiny",
            },
            wait=False,
        )
        for process in (judge, trainer, society):
            process.wait_serving()
        async with grpc.aio.insecure_channel(society.address) as channel:
            stub = pb_grpc.SocietyServiceStub(channel)
            sao = config(n_personas=18, batch_size=6, seed=5, validation_fraction=0.1, iterative_rounds=1)
            started = (
                await stub.StartSaoRound(
                    pb.StartSaoRoundRequest(dataset_id="sao-svc-1", config=sao, endpoint="support", train=True)
                )
            ).round
            assert started.state in ("queued", "running") and started.dataset_id == "sao-svc-1"
            await refused(
                stub.StartSaoRound(pb.StartSaoRoundRequest(dataset_id="sao-svc-1", config=sao)),
                grpc.StatusCode.ALREADY_EXISTS,
                "sao-svc-1",
            )
            done = await finished_round(stub, started.round_id)
            assert done.state == "succeeded", done.error
            (stats,) = [dict(r) for r in done.rounds]
            assert dict(stats["dropped"]) == {
                "duplicate_prompt": 2,
                "unparsable_ranking": 1,
                "judge_order_disagreement": 2,
            }
            assert (stats["judged"], stats["kept"], stats["attempted"], stats["trace_prompts"]) == (17, 15, 20, 2)
            assert traces.endpoints == ["support", "support"]  # two pages

            (info,) = (await stub.ListDatasets(pb.ListDatasetsRequest())).datasets
            assert (info.dataset_id, info.source, info.train_rows, info.validation_rows) == ("sao-svc-1", "sao", 13, 2)
            assert info.unique_prompts == 15 and info.manifest_uri.endswith("/preference/sao-svc-1/manifest.json")
            assert info.stats["order_agreement_rate"] == pytest.approx(15 / 17) and info.stats["trace_prompts"] == 2
            assert dict(info.stats["dropped"])["judge_order_disagreement"] == 2
            assert info.training_job_id, info.stats["training"]

            got = await stub.GetStats(pb.GetStatsRequest())
            assert (got.sao.datasets, got.sao.rounds, got.sao.pairs, got.sao.unique_prompts) == (1, 1, 15, 15)
            assert got.sao.prompt_repetition_rate == pytest.approx(2 / 20)
            assert got.sao.order_agreement_rate == pytest.approx(15 / 17)
            assert dict(got.sao.dropped_fraction) == pytest.approx(
                {"duplicate_prompt": 2 / 20, "unparsable_ranking": 1 / 20, "judge_order_disagreement": 2 / 20}
            )

            # Announced on the bus, with the job it submitted.
            catalogue = Catalogue(launch.isolation["namespace"])
            stream = next(s.name for s in catalogue.streams.values() if ".society." in s.subjects[0])
            msg = await nats_client.jetstream().get_last_msg(stream, catalogue.society_dataset("sao-svc-1"))
            event = society_events.SaoDatasetEvent.FromString(msg.data)
            assert (event.manifest_uri, event.train_rows, event.validation_rows) == (info.manifest_uri, 13, 2)
            assert event.training_job_id == info.training_job_id and event.meta.event_id == "sao-svc-1"

            # The trainer took the manifest as a DPO dataset (its SubmitJob reads and counts it, as
            # a dry run does) and holds the job (this trainer runs none).
            async with grpc.aio.insecure_channel(trainer.address) as tchannel:
                tstub = trainer_grpc.TrainerServiceStub(tchannel)
                job = (await tstub.GetJob(trainer_pb.GetJobRequest(job_id=info.training_job_id))).job
            assert job.spec.kind == jobs_pb2.TRAINING_KIND_DPO and job.spec.dataset_uri == info.manifest_uri
            assert job.spec.base_model == "tiny" and job.spec.policy_name == "sao-policy"
            assert job.state == jobs_pb2.JOB_STATE_QUEUED and job.total_steps > 0

            # Export, import under a new id, export again: the same records, split the same way.
            exported = (await stub.ExportDataset(pb.ExportDatasetRequest(dataset_id="sao-svc-1"))).jsonl
            rows = [json.loads(line) for line in exported.decode().splitlines()]
            assert len(rows) == 15 and set(TRACE_PROMPTS) <= {r["prompt"] for r in rows}
            assert {"prompt", "chosen", "rejected", "iteration", "timestamp"} <= set(rows[0])
            imported = (
                await stub.ImportDataset(pb.ImportDatasetRequest(dataset_id="sao-svc-copy", jsonl=exported))
            ).dataset
            assert (imported.source, imported.train_rows, imported.validation_rows) == ("import", 13, 2)
            assert imported.training_job_id == ""
            again = (await stub.ExportDataset(pb.ExportDatasetRequest(dataset_id="sao-svc-copy"))).jsonl
            assert again == exported
            assert [d.dataset_id for d in (await stub.ListDatasets(pb.ListDatasetsRequest(limit=1))).datasets] == [
                "sao-svc-copy"
            ]

            # A malformed import names its line; nothing is registered.
            lines = exported.split(b"\n")
            bad = [*lines[:2], b'{"prompt": "x", "chosen": "y"', *lines[2:]]
            await refused(
                stub.ImportDataset(pb.ImportDatasetRequest(dataset_id="sao-bad", jsonl=b"\n".join(bad))),
                INVALID,
                "jsonl: line 3",
            )
            missing = b'{"prompt": "p", "chosen": "a", "rejected": "b", "timestamp": 0}\n' * 2 + b'{"prompt": "p"}\n'
            await refused(stub.ImportDataset(pb.ImportDatasetRequest(jsonl=missing)), INVALID, "line 3", "chosen")
            assert len((await stub.ListDatasets(pb.ListDatasetsRequest())).datasets) == 2

            # Hostile and wrong requests: the field is named.
            await refused(
                stub.StartSaoRound(pb.StartSaoRoundRequest(config=config(n_personas="x"))), INVALID, "config.n_personas"
            )
            await refused(stub.StartSaoRound(pb.StartSaoRoundRequest(config=config(bogus=1))), INVALID, "config.bogus")
            await refused(
                stub.StartSaoRound(pb.StartSaoRoundRequest(config=config(temperature=9))), INVALID, "config.temperature"
            )
            await refused(
                stub.StartSaoRound(pb.StartSaoRoundRequest(config=config(model="openai/gpt-5"))),
                INVALID,
                "config.model",
            )
            await refused(
                stub.StartSaoRound(pb.StartSaoRoundRequest(dataset_id="a\x00b")), INVALID, "dataset_id", "NUL"
            )
            await refused(stub.StartSaoRound(pb.StartSaoRoundRequest(dataset_id="../etc")), INVALID, "dataset_id")
            await refused(stub.StartSaoRound(pb.StartSaoRoundRequest(endpoint="a.b")), INVALID, "endpoint")
            await refused(stub.ListDatasets(pb.ListDatasetsRequest(limit=2_000_000_000)), INVALID, "limit")
            await refused(stub.ListDatasets(pb.ListDatasetsRequest(limit=-1)), INVALID, "limit")
            await refused(stub.GetStats(pb.GetStatsRequest(run_id="r" * 10_000)), INVALID, "run_id")
            await refused(stub.GetSaoRound(pb.GetSaoRoundRequest(round_id="nope")), grpc.StatusCode.NOT_FOUND, "nope")
            await refused(stub.GetSaoRound(pb.GetSaoRoundRequest()), INVALID, "round_id")
            await refused(
                stub.ExportDataset(pb.ExportDatasetRequest(dataset_id="nope")), grpc.StatusCode.NOT_FOUND, "nope"
            )
            await refused(stub.ImportDataset(pb.ImportDatasetRequest(jsonl=b"\xff\xfe")), INVALID, "jsonl", "UTF-8")
            await refused(stub.ImportDataset(pb.ImportDatasetRequest(jsonl=b"\n\n")), INVALID, "jsonl", "no records")

        # Prometheus: the round's pairs and drops.
        async with httpx.AsyncClient(timeout=5) as http:
            text = (await http.get(f"http://127.0.0.1:{society.metrics_port}/metrics")).text
        assert "flywheel_society_sao_pairs_kept_total 15.0" in text
        assert 'flywheel_society_sao_pairs_dropped_total{reason="judge_order_disagreement"} 2.0' in text
        assert "flywheel_society_sao_pairs_order_agreed_total 15.0" in text
    finally:
        await policy.stop()
        await traces.server.stop(None)


async def test_a_round_left_running_by_a_dead_replica_is_queued_again(stack_env, monkeypatch):
    """Claims share the queue (SKIP LOCKED); a running round whose replica's connection is gone
    (its advisory lock released) goes back to the queue, a live one does not, and one that
    died MAX_ATTEMPTS times fails."""
    from flywheel.core import db
    from flywheel.core.settings import DatabaseSettings
    from flywheel.society.sao import SaoConfig
    from flywheel.society.sao.service import MAX_ATTEMPTS, SaoRounds
    from flywheel.stack.testing import migrate_in_process as migrate

    migrate("society", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = db.create_engine(DatabaseSettings())  # type: ignore[call-arg]
    sessions = db.session_factory(engine)
    rounds = SaoRounds(
        settings=None,  # type: ignore[arg-type]
        engine=engine,
        sessions=sessions,
        publisher=None,
        catalogue=None,
        objects=None,
        llm_for=None,  # type: ignore[arg-type]
        judge=None,
    )
    try:
        first, created = await rounds.queue(dataset_id="sao-a", config=SaoConfig(), model="m")
        again, created_again = await rounds.queue(dataset_id="sao-a", config=SaoConfig(), model="m")
        assert created and not created_again and again.round_id == first.round_id
        await rounds.queue(dataset_id="sao-b", config=SaoConfig(), model="m")

        live = await rounds._claim()
        dead = await rounds._claim()
        assert live and dead and live[1] == first.round_id != dead[1]  # the oldest first, then the next
        assert await rounds._claim() is None  # nothing left queued
        await dead[0].invalidate()  # the replica died: its connection, and so its lock, are gone

        assert await rounds.requeue_orphans() == 1
        assert (await rounds.get(dead[1])).state == "queued"
        assert (await rounds.get(live[1])).state == "running"  # its worker holds the lock

        for _ in range(MAX_ATTEMPTS - 1):  # it keeps dying
            conn, round_id = await rounds._claim()
            assert round_id == dead[1]
            await conn.invalidate()
            await rounds.requeue_orphans()
        got = await rounds.get(dead[1])
        assert got.state == "failed" and f"stopped {MAX_ATTEMPTS} times" in got.error
        await live[0].close()
    finally:
        await engine.dispose()
