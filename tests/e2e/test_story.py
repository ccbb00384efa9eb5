"""The whole story as a test: ``StorySizes.e2e()`` (the tiny model) on real servers, told once
for the module (``undisturbed_record``), then its counts and its lineage checked stage by stage:
every decision's feedback applied once and its trace rewarded, preference pairs exported from
the traces and merged with the SAO pairs into one registered dataset, one DPO job of exactly
``dpo_steps`` steps, version 1 as a canary arm, the bandit's verdict and the registry's status
agreeing, and every id of the lineage found by the service that owns it.

Run alone: ``.venv/bin/python -m pytest tests/e2e/test_story.py -q -p no:cacheprovider``"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.society.v1 import society_service_pb2 as soc_pb
from flywheel.api.society.v1 import society_service_pb2_grpc as soc_grpc
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.stack.stack import Stack
from flywheel.stack.story.canary import REGISTRY
from flywheel.stack.story.context import QuietProgress, StorySizes
from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.training import provenance
from flywheel.stack.story.world import load_cases

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SIZES = StorySizes.e2e()


@dataclass
class Told:
    record: StoryRecord
    stack: Stack
    seconds: float
    progress: QuietProgress


def undisturbed_record(root: Path, sizes: StorySizes = SIZES) -> Iterator[Told]:
    """Start a story stack under ``root``, tell the whole story undisturbed, yield it (the stack
    still up, for checks), then stop everything. A generator, for a fixture of any scope."""
    from flywheel.stack.story.run import start_story_stack, stop_story_stack, tell_story

    began = time.monotonic()
    stack, model = start_story_stack(root, sizes)
    try:
        progress = QuietProgress()
        try:
            record = asyncio.run(tell_story(stack, model, sizes, progress=progress))
        except BaseException:
            print("\n".join(["the story so far:", *progress.lines]))
            raise
        yield Told(record, stack, time.monotonic() - began, progress)
    finally:
        stop_story_stack(stack, model)


@pytest.fixture(scope="module")
def told() -> Iterator[Told]:
    root = Path(tempfile.mkdtemp(prefix="flywheel-story-"))  # outside pytest's tmp tree (PostgreSQL)
    try:
        yield from undisturbed_record(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_story_is_told_in_order_and_timed(told: Told) -> None:
    meta = told.record.meta
    print(f"\nstory: {told.seconds:.0f} s with the stack's start; stages {meta['stage_seconds']}")
    print("\n".join(told.progress.lines))
    assert list(meta["stage_seconds"]) == ["optimize", "traffic", "training", "canary"]
    assert meta["sizes"]["traffic_decisions"] == SIZES.traffic_decisions
    assert meta["models"]["trainer_base"] == "tiny" and meta["commit"]
    json.loads(told.record.to_json())  # plain JSON, as the record promises
    assert told.record.optimize is not None and told.record.optimize["state"] == "succeeded"


def test_stage_one_search_with_rlp_and_an_sao_round(told: Told) -> None:
    """The support assistant's batch run with the society on (RLP before each generation, one
    SAO round beside it), checked against itself: evaluations counted once along the curve, the
    best-so-far never falling, the SAO round's counts adding up, the top configs distinct and
    their replayable answers theirs. The tiny model writes gibberish, so RLP steps may fail
    (recorded by reason) and the SAO round may keep no pair; both outcomes are asserted exactly."""
    rec = told.record.optimize
    assert rec is not None
    json.dumps(rec)  # plain JSON, as the record promises

    # The run: succeeded, every evaluation counted once along the curve, none failed.
    assert rec["state"] == "succeeded" and rec["run_id"].startswith("run-")
    assert rec["evaluations"] > 0 and rec["evaluations_failed"] == 0, rec
    curve = rec["curve"]
    assert curve and curve[-1]["evaluation"] == rec["evaluations"]
    assert [p["evaluation"] for p in curve] == sorted({p["evaluation"] for p in curve})
    bests = [p["best"] for p in curve if p["best"] is not None]
    assert bests and bests == sorted(bests)

    # The best distinct configs for stage 2, with the answers their evaluations got.
    tops = rec["top_configs"]
    assert len(tops) == SIZES.arms
    assert len({json.dumps(t["params"], sort_keys=True) for t in tops}) == SIZES.arms
    assert {"system_prompt", "temperature", "max_tokens"} == set(tops[0]["params"])
    case_ids = {c["id"] for c in load_cases(SIZES.test_cases)}
    for top, out in zip(tops, rec["outputs"], strict=True):
        assert out["params"] == top["params"] and top["candidate_id"] in out["candidate_ids"]
        assert out["answers"] and set(out["answers"]) <= case_ids and set(out["scores"]) == set(out["answers"])

    # RLP: the society thought before the second generation (a failed step, say the tiny
    # model's thought timing out, is recorded by reason and never counted as a proposal).
    rlp = rec["rlp"]
    assert rlp["steps"] >= 1 and 0 <= rlp["steps_failed"] <= rlp["steps"]
    assert rlp["proposals_resolved"] <= rlp["proposals"]
    if rlp["steps_failed"]:
        assert sum(rlp["failures"].values()) == rlp["steps_failed"]

    # SAO: the counts add up; a dataset exactly when pairs were kept.
    sao = rec["sao"]
    assert sao["round_id"] and sao["attempted"] == SIZES.sao_personas
    assert sao["attempted"] == sao["kept"] + sum(sao["dropped"].values())
    if sao["state"] == "succeeded":
        assert sao["pairs"] == sao["kept"] > 0 and sao["manifest_uri"].endswith("/manifest.json")
    else:
        assert sao["state"] == "failed" and "no pair was kept" in sao["error"], sao
        assert sao["pairs"] == 0 and sao["dataset_id"] is None


def test_traffic_every_decision_fed_back_once_and_traced(told: Told) -> None:
    t = told.record.traffic
    assert t is not None
    assert t["decisions"] == t["feedback_sent"] == t["feedback_applied"] == t["traces"] == SIZES.traffic_decisions
    assert len(t["trace_ids"]) == len(set(t["trace_ids"])) == SIZES.traffic_decisions
    n = len(told.record.optimize["top_configs"])
    assert 2 <= n <= SIZES.arms and [a["arm_id"] for a in t["arms"]] == [f"config-{i}" for i in range(1, n + 1)]
    assert all(0 < a["true_rate"] < 1 for a in t["arms"])
    assert t["timeline"][-1]["decision"] == SIZES.traffic_decisions
    # The verdict on the final posteriors: every arm's P(best), the favourite the most probable.
    v = t["verdict"]
    assert set(v["p_best"]) == {a["arm_id"] for a in t["arms"]}
    assert sum(v["p_best"].values()) == pytest.approx(1.0, abs=0.01)
    assert v["favourite"] == max(v["p_best"], key=v["p_best"].get)
    assert v["hidden_best"] == max(t["arms"], key=lambda a: a["true_rate"])["arm_id"]
    # Beta(1, 1) prior plus one unit per applied 0/1 reward: as many as decided so far, at most
    # (the last decisions' feedback may still be on its way when a point is taken).
    seen = [sum(p["alpha"] + p["beta"] - 2 for p in point["posterior"].values()) for point in t["timeline"]]
    assert seen == sorted(seen), seen
    assert all(0 <= n <= point["decision"] for n, point in zip(seen, t["timeline"], strict=True)), seen


def test_training_one_dataset_one_job_version_one(told: Told) -> None:
    tr = told.record.training
    assert tr is not None
    assert tr["trace_pairs"] > 0, tr
    assert tr["dataset_rows"] == tr["trace_pairs"] + tr["sao_pairs"]
    assert set(tr["source_traces"]) <= set(told.record.traffic["trace_ids"])
    assert tr["job_state"] == "JOB_STATE_SUCCEEDED" and tr["job_step"] == SIZES.dpo_steps
    assert [s["step"] for s in tr["steps"]] == list(range(1, SIZES.dpo_steps + 1)), tr["steps"]
    assert (tr["version"], tr["policy_name"], tr["base_model"]) == (1, "support-assistant", "tiny")
    assert tr["arm_id"] == tr["served_model"] == "support-assistant-v1"


def test_canary_verdict_and_registry_agree(told: Told) -> None:
    c, t = told.record.canary, told.record.traffic
    assert c is not None and t is not None
    assert c["decision"] in REGISTRY
    assert c["policy_status"] == jobs.PolicyStatus.Name(REGISTRY[c["decision"]])
    want_arm = {"promoted": "ARM_STATUS_ACTIVE", "rolled_back": "ARM_STATUS_RETIRED", "undecided": "ARM_STATUS_CANARY"}
    assert c["arm_status"] == want_arm[c["decision"]]
    if c["decision"] == "undecided":
        assert c["decisions"] == SIZES.canary_max_decisions
    else:
        assert 0 < c["decisions"] <= SIZES.canary_max_decisions
    assert c["canary_decisions"] > 0 and c["timeline"]
    assert all(0 <= p["p_better"] <= 1 for p in c["timeline"])
    # Feedback and traces of both stages: each decision once.
    assert c["feedback_applied"] == c["traces"] == t["decisions"] + c["decisions"]


async def test_the_lineage_ids_are_real(told: Told) -> None:
    record, stack = told.record, told.stack
    lineage = {(e["kind"], e["id"]): e["from"] for e in record.lineage}
    kinds = [k for k, _ in lineage]
    assert {"trace", "trace_dataset", "dataset", "job", "policy", "arm", "decision"} <= set(kinds), kinds
    tr = record.training
    assert lineage[("job", tr["job_id"])] == [tr["dataset_id"]]
    assert lineage[("policy", tr["policy_id"])] == [tr["job_id"]]
    assert lineage[("arm", tr["arm_id"])] == [tr["policy_id"]]
    assert tr["trace_dataset_id"] in lineage[("dataset", tr["dataset_id"])]
    addr = {name: proc.address for name, proc in stack.services.items()}
    async with (
        grpc.aio.insecure_channel(addr["trainer"]) as t_ch,
        grpc.aio.insecure_channel(addr["society"]) as s_ch,
        grpc.aio.insecure_channel(addr["trace_store"]) as ts_ch,
        grpc.aio.insecure_channel(addr["optimizer"]) as o_ch,
    ):
        trainer = pb_grpc.TrainerServiceStub(t_ch)
        policy = (await trainer.GetPolicy(pb.GetPolicyRequest(policy_id=tr["policy_id"]))).policy
        assert (policy.job_id, policy.arm_id, policy.version) == (tr["job_id"], tr["arm_id"], 1)
        job = (await trainer.GetJob(pb.GetJobRequest(job_id=tr["job_id"]))).job
        assert job.spec.dataset_uri == tr["dataset_manifest_uri"] == policy.dataset_uri
        assert job.spec.hyperparameters["max_steps"] == SIZES.dpo_steps

        society = soc_grpc.SocietyServiceStub(s_ch)
        listed = {d.dataset_id: d for d in (await society.ListDatasets(soc_pb.ListDatasetsRequest())).datasets}
        assert listed[tr["dataset_id"]].source == "import"
        if tr["sao_dataset_id"]:
            assert tr["sao_dataset_id"] in listed
        rows = (await society.ExportDataset(soc_pb.ExportDatasetRequest(dataset_id=tr["dataset_id"]))).jsonl
        kept = [json.loads(line) for line in rows.decode().splitlines() if line.strip()]
        by_origin = {o: sum(provenance(r) == o for r in kept) for o in ("trace", "sao")}
        assert by_origin == {"trace": tr["trace_pairs"], "sao": tr["sao_pairs"]}
        named = {t for r in kept if provenance(r) == "trace" for t in r["persona"].split(":", 1)[1].split(",")}
        assert named == set(tr["source_traces"])

        store = ts_grpc.TraceStoreServiceStub(ts_ch)
        for trace_id in tr["source_traces"][:5]:
            spans = (await store.GetTrace(ts_pb.GetTraceRequest(trace_id=trace_id))).spans
            assert spans and {s.trace_id for s in spans} == {trace_id}

        admin = admin_grpc.EndpointAdminServiceStub(o_ch)
        endpoint = (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-assistant"))).endpoint
        assert tr["arm_id"] in {a.arm_id for a in endpoint.arms}
