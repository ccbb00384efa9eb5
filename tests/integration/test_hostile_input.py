"""Hostile input against the running stack: every gRPC method of every service and every
subject a product or peer publishes to, fed undecodable bytes, invalid UTF-8, NUL bytes,
NaN and infinity, huge and deep values, out-of-range times, enums and sizes, path-like and
quote-laden names, and unknown or duplicate ids.

Each gRPC case must get the status code its table row names, with a message that names the
field and shows no internals (stack, SQL, exception names); each bus case must be
dead-lettered with a reason by every consumer of its subject. After every case a valid
request right behind it must succeed, and every service must still be SERVING.

A bad event must be rejected as bad (a dead letter that says "failed N times" means the
consumer retried it as if it were a transient failure). Subjects with no consumer today (run
progress, training jobs, trainer events, society datasets, exported datasets) have nothing to
refuse and are not here; the trainer's job methods only have to answer UNIMPLEMENTED cleanly (its
policy registry methods are in the tables like every other service's).

The services start once for the module; cases share them and use fresh names.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import grpc
import nats
import pytest
import pytest_asyncio
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flywheel.api.common.v1.common_pb2 import DeadLetter, EventMeta
from flywheel.api.evaluator.v1 import events_pb2 as eval_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1 import events_pb2 as opt_events
from flywheel.api.optimizer.v1 import off_policy_service_pb2 as ope_pb
from flywheel.api.optimizer.v1 import run_service_pb2 as run_pb
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.reward.v1 import reward_judge_service_pb2 as judge_pb
from flywheel.api.society.v1 import events_pb2 as society_pb
from flywheel.api.society.v1 import society_service_pb2 as soc_pb
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import spans_pb2
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.api.trainer.v1 import trainer_service_pb2 as trainer_pb

from .helpers import eventually, three_arm_endpoint
from .hostile import (
    BAD_WIRE_TYPE,
    HOSTILE_NAMES,
    HOSTILE_STRUCTS,
    HUGE,
    MARKER,
    TRUNCATED,
    YEAR_0,
    YEAR_10000,
    Outcome,
    call_raw,
    leaks,
    put,
    struct,
    swap_marker,
    ts,
    with_bad_utf8,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

S = grpc.StatusCode
INVALID, NOT_FOUND, EXISTS, UNIMPL, OK = (
    S.INVALID_ARGUMENT,
    S.NOT_FOUND,
    S.ALREADY_EXISTS,
    S.UNIMPLEMENTED,
    S.OK,
)
SERVICES = ("optimizer", "trace_store", "reward_judge", "evaluator", "society", "trainer")
AGENT = "hostile-agent"


def uid(prefix: str = "h") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------------------------
# The module's stack and the state valid requests need.


@dataclass
class Ctx:
    channels: dict[str, grpc.aio.Channel]
    catalogue: Catalogue
    db_url: str
    schema: str
    endpoint: str = "hostile-ep"  # Beta endpoint with arms small/large/creative
    arms_endpoint: str = "hostile-arms"  # AddArm / RetireArm go here
    update_endpoint: str = "hostile-upd"
    trace_id: str = ""
    decision_id: str = ""
    finished_run: str = ""
    gauss_endpoint: str = "hostile-gauss"  # unbounded rewards
    results_run: str = ""  # running while the suite lasts: evaluation results go here
    results_candidate: str = ""
    proposals_run: str = ""  # running while the suite lasts: proposals go here
    letters: list[DeadLetter] = field(default_factory=list)
    results: dict[str, eval_pb.EvaluationResult] = field(default_factory=dict)

    def stub_call(self, service: str, path: str, request: Message, response_type: type[Message]) -> Awaitable[Any]:
        return self.channels[service].unary_unary(
            path, request_serializer=type(request).SerializeToString, response_deserializer=response_type.FromString
        )(request, timeout=20)

    async def select(self, endpoint: str | None = None) -> sel_pb.SelectResponse:
        return await self.stub_call(
            "optimizer", SEL + "Select", sel_pb.SelectRequest(endpoint=endpoint or self.endpoint), sel_pb.SelectResponse
        )

    async def finished(self) -> str:
        """The finished run's id, once it has succeeded (it runs while the first cases do)."""

        async def state() -> int:
            got = await self.stub_call(
                "optimizer", RUN + "GetRun", run_pb.GetRunRequest(run_id=self.finished_run), run_pb.GetRunResponse
            )
            return got.run.state

        await eventually(state, lambda s: s == runs_pb2.RUN_STATE_SUCCEEDED, timeout_s=60)
        return self.finished_run

    async def start_run(self, config: dict[str, Any]) -> str:
        resp = await self.stub_call(
            "optimizer", RUN + "StartRun", run_pb.StartRunRequest(config=struct(config)), run_pb.StartRunResponse
        )
        return resp.run.run_id

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.db_url, server_settings={"search_path": self.schema})
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()


def slow_run_config() -> dict[str, Any]:
    """A run that stays running for the whole module: each evaluation sleeps 30 s, one at a
    time, over a search space too large to be exhausted."""
    config = run_config(generations=50, delay_s=30.0, population=4)
    config["search_space"]["parameters"] = {
        "prefix": {"choices": ["", "A: ", "B: ", "C: "]},
        "delay_s": {"type": "float", "min": 30.0, "max": 31.0, "step": 0.01},
    }
    return config


def run_config(*, generations: int = 1, delay_s: float = 0.0, population: int = 2) -> dict[str, Any]:
    """A small run of the evaluator's echo example (the empty prefix wins)."""
    return {
        "api": {"name": "echo", "kind": "python", "callable": "flywheel.evaluator.examples:echo"},
        "search_space": {"parameters": {"prefix": {"choices": ["", "A: "]}, "delay_s": {"choices": [delay_s]}}},
        "evaluation": {
            "test_cases": {"inline": [{"id": "q0", "input": "2+2?", "expected": "2+2?"}]},
            "metrics": {"correct": {"type": "exact_match", "weight": 1.0}},
        },
        "optimization": {
            "seed": 1,
            "evolution": {"population": population, "generations": generations, "elite": 1},
            "execution": {"parallel_workers": 1, "timeout_s": 600},
        },
    }


@pytest.fixture(scope="module")
def processes(launch_module):
    env = {
        # The one module valid runs and evaluation requests may call (the run policy refuses any by default).
        "FLYWHEEL_RUN_POLICY_CALLABLE_MODULES": "flywheel.evaluator.examples",
        "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
        "FLYWHEEL_REWARD_JUDGE_LLM_TIMEOUT_S": "1",
        "FLYWHEEL_EVALUATOR_CONCURRENCY": "8",
    }
    # Started together and then waited for: one after another costs a minute on two cores.
    procs = {name: launch_module(name, env=env, wait=False) for name in SERVICES}
    for proc in procs.values():
        proc.wait_serving(timeout_s=120)
    return launch_module, procs


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ctx(processes, servers) -> Any:
    launcher, procs = processes
    env = launcher.env
    big = [("grpc.max_send_message_length", 64 * 1024 * 1024), ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    channels = {name: grpc.aio.insecure_channel(p.address, options=big) for name, p in procs.items()}
    c = Ctx(
        channels=channels,
        catalogue=Catalogue(env["FLYWHEEL_NATS_NAMESPACE"]),
        db_url=env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://"),
        schema=env["FLYWHEEL_DB_SCHEMA"],
    )
    # Dead letters and evaluation results, collected for the whole module.
    nc = await nats.connect(servers.nats.url, user=servers.nats.user, password=servers.nats.password)

    async def on_letter(msg) -> None:
        letter = DeadLetter()
        letter.ParseFromString(msg.data)
        c.letters.append(letter)

    async def on_result(msg) -> None:
        result = eval_pb.EvaluationResult()
        with contextlib.suppress(Exception):
            result.ParseFromString(msg.data)
            c.results[result.request_id] = result

    await nc.subscribe(f"{c.catalogue.namespace}.deadletter.>", cb=on_letter)
    await nc.subscribe(f"{c.catalogue.namespace}.evaluator.result.>", cb=on_result)

    gauss = three_arm_endpoint(c.gauss_endpoint)
    gauss.endpoint.policy.kind = ep_pb.POLICY_KIND_THOMPSON_GAUSSIAN
    gauss.endpoint.reward_spec.bounded = False
    await c.stub_call("optimizer", ADMIN + "CreateEndpoint", gauss, admin_pb.CreateEndpointResponse)
    for name in (c.endpoint, c.arms_endpoint, c.update_endpoint):
        await c.stub_call(
            "optimizer", ADMIN + "CreateEndpoint", three_arm_endpoint(name), admin_pb.CreateEndpointResponse
        )
    # A decision with feedback, so off-policy estimates have a log to read.
    decision = await c.select()
    c.decision_id = decision.decision_id
    await asyncio.sleep(0.3)
    await c.stub_call(
        "optimizer",
        SEL + "Update",
        sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=1.0, feedback_id=uid("fb")),
        sel_pb.UpdateResponse,
    )
    c.trace_id = await ingest_trace(c)
    # A run that finishes (for artifacts) and two that stay running (for results and
    # proposals: their echo sleeps 30 s per evaluation, one at a time).
    c.finished_run = await c.start_run(run_config())
    c.results_run = await c.start_run(slow_run_config())
    c.proposals_run = await c.start_run(slow_run_config())
    # The run driver makes the first generation's candidates on its next tick.
    rows = await eventually(
        lambda: c.fetch("SELECT candidate_id FROM run_candidates WHERE run_id = $1 LIMIT 1", c.results_run), bool
    )
    c.results_candidate = rows[0]["candidate_id"]
    yield c
    for run_id in (c.results_run, c.proposals_run):
        with contextlib.suppress(grpc.RpcError):
            await c.stub_call(
                "optimizer", RUN + "CancelRun", run_pb.CancelRunRequest(run_id=run_id), run_pb.CancelRunResponse
            )
    await nc.close()
    for channel in channels.values():
        await channel.close()


async def ingest_trace(c: Ctx) -> str:
    trace_id = uuid.uuid4().hex
    await call_raw(
        c.channels["trace_store"],
        TS + "Ingest",
        ts_pb.IngestRequest(batch=span_batch(trace_id)).SerializeToString(),
        "bidi",
    )
    return trace_id


def span(trace_id: str, span_id: str | None = None, **kw: Any) -> spans_pb2.Span:
    """A valid prompt span (OpenTelemetry ids: 32 and 16 lowercase hex chars)."""
    now = int(time.time())
    return spans_pb2.Span(
        trace_id=trace_id,
        span_id=span_id or uuid.uuid4().hex[:16],
        kind=spans_pb2.SPAN_KIND_PROMPT,
        name="answer",
        agent=AGENT,
        start_time=ts(now),
        end_time=ts(now + 1),
        status=spans_pb2.SPAN_STATUS_OK,
        input="What is 2+2?",
        output="4",
        attributes=struct({"plan": "pro"}),
        **kw,
    )


def span_batch(trace_id: str | None = None) -> spans_pb2.SpanBatch:
    """A prompt span and a reward span under it (so the trace can go into an SFT dataset)."""
    prompt = span(trace_id or uuid.uuid4().hex)
    reward = spans_pb2.Span(
        trace_id=prompt.trace_id,
        span_id=uuid.uuid4().hex[:16],
        parent_span_id=prompt.span_id,
        kind=spans_pb2.SPAN_KIND_REWARD,
        name="votes",
        agent=AGENT,
        start_time=prompt.end_time,
        end_time=prompt.end_time,
        status=spans_pb2.SPAN_STATUS_OK,
        reward=0.9,
        reward_min=0.0,
        reward_max=1.0,
    )
    return spans_pb2.SpanBatch(meta=EventMeta(event_id=uid("batch")), spans=[prompt, reward])


# ---------------------------------------------------------------------------------------
# gRPC methods: where they live and a valid request for each.

SEL = "/flywheel.api.optimizer.v1.SelectionService/"
ADMIN = "/flywheel.api.optimizer.v1.EndpointAdminService/"
OPE = "/flywheel.api.optimizer.v1.OffPolicyService/"
RUN = "/flywheel.api.optimizer.v1.RunService/"
TS = "/flywheel.api.traces.v1.TraceStoreService/"
JUDGE = "/flywheel.api.reward.v1.RewardJudgeService/"
TRAINER = "/flywheel.api.trainer.v1.TrainerService/"
SOCIETY = "/flywheel.api.society.v1.SocietyService/"

Good = Callable[[Ctx], Awaitable[Message]]


@dataclass(frozen=True)
class Method:
    service: str
    path: str
    good: Good
    shape: str = "unary"

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def const(msg_factory: Callable[[], Message]) -> Good:
    async def build(c: Ctx) -> Message:
        return msg_factory()

    return build


async def good_select(c: Ctx) -> Message:
    return sel_pb.SelectRequest(
        endpoint=c.endpoint, user_id="user-1", session_id="s-1", context=struct({"plan": "pro"})
    )


async def good_select_batch(c: Ctx) -> Message:
    return sel_pb.SelectBatchRequest(
        requests=[sel_pb.SelectRequest(endpoint=c.endpoint, user_id=f"u{i}") for i in range(2)]
    )


async def good_update(c: Ctx) -> Message:
    decision = await c.select()
    await asyncio.sleep(0.1)  # logged by the next flush
    return sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=1.0, feedback_id=uid("fb"))


async def good_create(c: Ctx) -> Message:
    req = three_arm_endpoint(uid("ep"))
    req.endpoint.description = "made by the hostile suite"
    req.endpoint.policy.kind = ep_pb.POLICY_KIND_THOMPSON_BETA
    req.endpoint.policy.exploration_floor = 0.01
    req.endpoint.policy.incumbent.min_pulls = 10
    req.endpoint.policy.canary.min_pulls = 10
    req.endpoint.policy.segment_key = "plan"
    return req


async def good_update_endpoint(c: Ctx) -> Message:
    got = await c.stub_call(
        "optimizer",
        ADMIN + "GetEndpoint",
        admin_pb.GetEndpointRequest(name=c.update_endpoint),
        admin_pb.GetEndpointResponse,
    )
    endpoint = got.endpoint
    del endpoint.stats[:]
    endpoint.ClearField("created_at")
    endpoint.incumbent_arm_id = ""
    endpoint.description = uid("desc")
    return admin_pb.UpdateEndpointRequest(endpoint=endpoint)


async def good_add_arm(c: Ctx) -> Message:
    return admin_pb.AddArmRequest(
        endpoint=c.arms_endpoint, arm=ep_pb.Arm(arm_id=uid("arm"), params=struct({"model": "m"}))
    )


async def good_retire_arm(c: Ctx) -> Message:
    add = await good_add_arm(c)
    await c.stub_call("optimizer", ADMIN + "AddArm", add, admin_pb.AddArmResponse)
    return admin_pb.RetireArmRequest(endpoint=c.arms_endpoint, arm_id=add.arm.arm_id)


async def good_ope(c: Ctx) -> Message:
    return ope_pb.EstimatePolicyValueRequest(
        endpoint=c.endpoint,
        candidate=ope_pb.CandidatePolicy(
            # Every arm has weight, so whichever arm the logged decisions chose, the estimate exists.
            distribution=ope_pb.ArmDistribution(probabilities={"small": 0.25, "large": 0.25, "creative": 0.5})
        ),
        since=ts(int(time.time()) - 3600),
        until=ts(int(time.time()) + 3600),
        confidence=0.9,
    )


async def good_start_run(c: Ctx) -> Message:
    return run_pb.StartRunRequest(config=struct(run_config()))


async def good_artifact(c: Ctx) -> Message:
    return run_pb.GetRunArtifactRequest(run_id=await c.finished(), name="best_config.json")


async def good_cancel_run(c: Ctx) -> Message:
    return run_pb.CancelRunRequest(run_id=await c.start_run(run_config()))


async def good_ingest(c: Ctx) -> Message:
    return ts_pb.IngestRequest(batch=span_batch())


async def good_query(c: Ctx) -> Message:
    now = int(time.time())
    return ts_pb.QueryTracesRequest(
        agent=AGENT,
        endpoint="",
        text="2+2",
        start_after=ts(now - 3600),
        start_before=ts(now + 3600),
        page={"page_size": 10},
    )


async def good_export(c: Ctx) -> Message:
    return ts_pb.ExportDatasetRequest(
        kind=ts_pb.DATASET_KIND_SFT,
        filter=ts_pb.QueryTracesRequest(agent=AGENT, start_after=ts(int(time.time()) - 3600)),
        validation_fraction=0.1,
    )


H = judge_pb.JUDGE_KIND_HEURISTIC


def good_aggregate() -> Message:
    return judge_pb.AggregateRequest(
        candidates=[
            judge_pb.Candidate(id=name, signals=[judge_pb.Signal(name="quality", value=v, min=0, max=1, weight=1)])
            for name, v in (("a", 0.6), ("b", 0.4))
        ],
        method=judge_pb.AGGREGATION_METHOD_WEIGHTED_MEAN,
    )


def good_trace_reward() -> Message:
    return judge_pb.TraceRewardRequest(
        spans=[
            spans_pb2.Span(
                kind=spans_pb2.SPAN_KIND_REWARD,
                name="votes",
                reward=3,
                reward_min=0,
                reward_max=10,
                attributes=struct({"k": 1}),
            )
        ],
        answer="Short.",
    )


def good_put_rubric() -> Message:
    name = uid("rubric").replace("-", "_")
    return judge_pb.PutRubricRequest(
        yaml=f"name: {name}\ndescription: Replies\ncriteria:\n  - {{name: helpful, description: Helps, weight: 1}}\n"
    )


def good_put_rubric_message() -> Message:
    name = uid("rubric").replace("-", "_")
    return judge_pb.PutRubricRequest(
        rubric=judge_pb.Rubric(
            name=name,
            description="Replies",
            criteria=[judge_pb.Criterion(name="helpful", description="Helps", weight=1)],
        )
    )


def _registration(name: str | None = None) -> trainer_pb.RegisterPolicyRequest:
    return trainer_pb.RegisterPolicyRequest(
        name=name or uid("pol"),
        kind=jobs_pb2.TRAINING_KIND_DPO,
        base_model="s3://models/base",
        checkpoint_uri="s3://checkpoints/adapter",
        dataset_uri="s3://exports/manifest.json",
        job_id=uid("job"),
        metrics={"win_rate": 0.6},
        reason="hostile suite",
        actor="hostile",
    )


async def _registered(c: Ctx, name: str | None = None) -> jobs_pb2.Policy:
    got = await c.stub_call(
        "trainer", TRAINER + "RegisterPolicy", _registration(name), trainer_pb.RegisterPolicyResponse
    )
    return got.policy


async def good_get_policy(c: Ctx) -> Message:
    return trainer_pb.GetPolicyRequest(policy_id=(await _registered(c)).policy_id)


async def good_set_policy_status(c: Ctx) -> Message:
    policy = await _registered(c)
    return trainer_pb.SetPolicyStatusRequest(
        policy_id=policy.policy_id, status=jobs_pb2.POLICY_STATUS_CANARY, reason="try it", actor="hostile"
    )


async def good_promote_policy(c: Ctx) -> Message:
    return trainer_pb.PromotePolicyRequest(policy_id=(await _registered(c)).policy_id, reason="r", actor="hostile")


async def _nothing_active(c: Ctx, msg: Message) -> None:
    # A name with one registered version and none ever active: nothing to roll back.
    msg.name = (await _registered(c)).name  # type: ignore[attr-defined]


async def good_rollback_policy(c: Ctx) -> Message:
    name = uid("pol")
    for _ in range(2):
        policy = await _registered(c, name)
        await c.stub_call(
            "trainer",
            TRAINER + "PromotePolicy",
            trainer_pb.PromotePolicyRequest(policy_id=policy.policy_id),
            trainer_pb.PromotePolicyResponse,
        )
    return trainer_pb.RollbackPolicyRequest(name=name, reason="worse", actor="hostile")


M = {
    m.path: m
    for m in [
        Method("optimizer", SEL + "Select", good_select),
        Method("optimizer", SEL + "SelectBatch", good_select_batch),
        Method("optimizer", SEL + "Update", good_update),
        Method("optimizer", ADMIN + "CreateEndpoint", good_create),
        Method(
            "optimizer", ADMIN + "GetEndpoint", lambda c: const(lambda: admin_pb.GetEndpointRequest(name=c.endpoint))(c)
        ),
        Method("optimizer", ADMIN + "ListEndpoints", const(admin_pb.ListEndpointsRequest)),
        Method("optimizer", ADMIN + "UpdateEndpoint", good_update_endpoint),
        Method("optimizer", ADMIN + "AddArm", good_add_arm),
        Method("optimizer", ADMIN + "RetireArm", good_retire_arm),
        Method("optimizer", OPE + "EstimatePolicyValue", good_ope),
        Method("optimizer", RUN + "StartRun", good_start_run),
        Method("optimizer", RUN + "GetRun", lambda c: const(lambda: run_pb.GetRunRequest(run_id=c.finished_run))(c)),
        Method(
            "optimizer",
            RUN + "WatchRun",
            lambda c: const(lambda: run_pb.WatchRunRequest(run_id=c.finished_run))(c),
            "server_stream",
        ),
        Method("optimizer", RUN + "CancelRun", good_cancel_run),
        Method("optimizer", RUN + "ListRuns", const(lambda: run_pb.ListRunsRequest(limit=10))),
        Method(
            "optimizer",
            RUN + "GetRunArtifact",
            good_artifact,
        ),
        Method(
            "optimizer",
            RUN + "ListRunCandidates",
            lambda c: const(lambda: run_pb.ListRunCandidatesRequest(run_id=c.finished_run))(c),
        ),
        Method("trace_store", TS + "Ingest", good_ingest, "bidi"),
        Method("trace_store", TS + "GetTrace", lambda c: const(lambda: ts_pb.GetTraceRequest(trace_id=c.trace_id))(c)),
        Method("trace_store", TS + "QueryTraces", good_query),
        Method(
            "trace_store",
            TS + "GetDecision",
            lambda c: const(lambda: ts_pb.GetDecisionRequest(decision_id=c.decision_id))(c),
        ),
        Method("trace_store", TS + "ExportDataset", good_export),
        Method("trace_store", TS + "DeleteTraces", const(lambda: ts_pb.DeleteTracesRequest(trace_id=uuid.uuid4().hex))),
        Method(
            "reward_judge", JUDGE + "Score", const(lambda: judge_pb.ScoreRequest(prompt="Q?", response="A.", judge=H))
        ),
        Method(
            "reward_judge",
            JUDGE + "Rank",
            const(lambda: judge_pb.RankRequest(prompt="Q?", responses=["A.", "B, longer."], judge=H)),
        ),
        Method(
            "reward_judge",
            JUDGE + "Compare",
            const(lambda: judge_pb.CompareRequest(prompt="Q?", response_a="A.", response_b="B.", judge=H)),
        ),
        Method("reward_judge", JUDGE + "Aggregate", const(good_aggregate)),
        Method("reward_judge", JUDGE + "TraceReward", const(good_trace_reward)),
        Method("reward_judge", JUDGE + "ListRubrics", const(judge_pb.ListRubricsRequest)),
        Method("reward_judge", JUDGE + "GetRubric", const(lambda: judge_pb.GetRubricRequest(name="default"))),
        Method("reward_judge", JUDGE + "PutRubric", const(good_put_rubric)),
        Method("reward_judge", JUDGE + "GetReliability", const(judge_pb.GetReliabilityRequest)),
        Method("trainer", TRAINER + "GetPolicy", good_get_policy),
        Method("trainer", TRAINER + "ListPolicies", const(lambda: trainer_pb.ListPoliciesRequest(name="x"))),
        Method("trainer", TRAINER + "SetPolicyStatus", good_set_policy_status),
        Method("trainer", TRAINER + "RegisterPolicy", const(_registration)),
        Method("trainer", TRAINER + "PromotePolicy", good_promote_policy),
        Method("trainer", TRAINER + "RollbackPolicy", good_rollback_policy),
    ]
}
# The trainer's job methods are not implemented yet: they must answer UNIMPLEMENTED, cleanly.
# The trainer's job methods: (request, the code it must get, a word its message must name).
_NAN = jobs_pb2.TrainingJobSpec(kind=jobs_pb2.TRAINING_KIND_DPO, base_model="tiny", dataset_uri="s3://b/d/m.json")
_NAN.hyperparameters.update({"learning_rate": float("nan")})
TRAINER_REQUESTS = {
    "SubmitJob": (
        trainer_pb.SubmitJobRequest(spec=jobs_pb2.TrainingJobSpec(kind=jobs_pb2.TRAINING_KIND_SFT)),
        "INVALID",
        "spec.base_model",
    ),
    "SubmitJob-nan": (trainer_pb.SubmitJobRequest(spec=_NAN), "INVALID", "learning_rate"),
    "SubmitJob-path": (
        trainer_pb.SubmitJobRequest(
            spec=jobs_pb2.TrainingJobSpec(kind=jobs_pb2.TRAINING_KIND_SFT, base_model="../../etc", dataset_uri="x")
        ),
        "INVALID",
        "spec.base_model",
    ),
    "GetJob": (trainer_pb.GetJobRequest(job_id="j1"), "NOT_FOUND", "j1"),
    "GetJob-nul": (trainer_pb.GetJobRequest(job_id="j\x001"), "INVALID", "job_id"),
    "GetJob-huge": (trainer_pb.GetJobRequest(job_id="j" * 1_000_000), "INVALID", "job_id"),
    "ListJobs": (trainer_pb.ListJobsRequest(), "OK", ""),
    "ListJobs-limit": (trainer_pb.ListJobsRequest(limit=-1), "INVALID", "limit"),
    "CancelJob": (trainer_pb.CancelJobRequest(job_id="j1"), "NOT_FOUND", "j1"),
}

# The society's methods: (request, the code it must get, a word its message must name). This
# society has no reward judge, so a valid StartSaoRound is FAILED_PRECONDITION (it says so).
_LINE3 = b'{"prompt": "p", "chosen": "a", "rejected": "b", "timestamp": 0}\n' * 2 + b'{"prompt": "p", "chosen"\n'
SOCIETY_REQUESTS = {
    "GetStats": (soc_pb.GetStatsRequest(), "OK", ""),
    "GetStats-nul": (soc_pb.GetStatsRequest(run_id="r\x001"), "INVALID", "run_id"),
    "GetStats-huge": (soc_pb.GetStatsRequest(run_id=HUGE), "INVALID", "run_id"),
    "StartSaoRound": (soc_pb.StartSaoRoundRequest(config=struct({"n_personas": 2})), "FAILED_PRECONDITION", "judge"),
    "StartSaoRound-unknown-field": (
        soc_pb.StartSaoRoundRequest(config=struct({"bogus": 1})),
        "INVALID",
        "config.bogus",
    ),
    "StartSaoRound-nan": (
        soc_pb.StartSaoRoundRequest(config=struct({"temperature": math.nan})),
        "INVALID",
        "config.temperature",
    ),
    "StartSaoRound-wrong-type": (
        soc_pb.StartSaoRoundRequest(config=struct({"n_personas": "many"})),
        "INVALID",
        "config.n_personas",
    ),
    "StartSaoRound-1mb": (soc_pb.StartSaoRoundRequest(config=struct({"seed": HUGE})), "INVALID", "config"),
    "StartSaoRound-model": (
        soc_pb.StartSaoRoundRequest(config=struct({"model": "openai/not-allowed"})),
        "INVALID",
        "config.model",
    ),
    "StartSaoRound-dataset-nul": (soc_pb.StartSaoRoundRequest(dataset_id="d\x001"), "INVALID", "dataset_id"),
    "StartSaoRound-dataset-path": (soc_pb.StartSaoRoundRequest(dataset_id="../../etc"), "INVALID", "dataset_id"),
    "StartSaoRound-dataset-huge": (soc_pb.StartSaoRoundRequest(dataset_id=HUGE), "INVALID", "dataset_id"),
    "StartSaoRound-endpoint": (soc_pb.StartSaoRoundRequest(endpoint="a'; DROP TABLE x;--"), "INVALID", "endpoint"),
    "GetSaoRound": (soc_pb.GetSaoRoundRequest(round_id="r1"), "NOT_FOUND", "r1"),
    "GetSaoRound-empty": (soc_pb.GetSaoRoundRequest(), "INVALID", "round_id"),
    "GetSaoRound-nul": (soc_pb.GetSaoRoundRequest(round_id="r\x001"), "INVALID", "round_id"),
    "ListDatasets": (soc_pb.ListDatasetsRequest(), "OK", ""),
    "ListDatasets-negative": (soc_pb.ListDatasetsRequest(limit=-1), "INVALID", "limit"),
    "ListDatasets-huge": (soc_pb.ListDatasetsRequest(limit=2_000_000_000), "INVALID", "limit"),
    "ImportDataset-line3": (soc_pb.ImportDatasetRequest(jsonl=_LINE3), "INVALID", "line 3"),
    "ImportDataset-utf8": (soc_pb.ImportDatasetRequest(jsonl=b"\xff\xfe"), "INVALID", "jsonl"),
    "ImportDataset-empty": (soc_pb.ImportDatasetRequest(), "INVALID", "jsonl"),
    "ImportDataset-dataset-nul": (soc_pb.ImportDatasetRequest(dataset_id="d\x001"), "INVALID", "dataset_id"),
    "ExportDataset": (soc_pb.ExportDatasetRequest(dataset_id="d1"), "NOT_FOUND", "d1"),
    "ExportDataset-nul": (soc_pb.ExportDatasetRequest(dataset_id="d\x001"), "INVALID", "dataset_id"),
}

# ---------------------------------------------------------------------------------------
# Field tables: (method, field path, category). A category expands into hostile kinds.
#   text   - free text: NUL, invalid UTF-8, 1 MB
#   name   - an identifier being created: also path-like and quote-laden names
#   lookup - an identifier being looked up: like name, but NOT_FOUND is a fine answer
#   filter - a query filter: NUL, invalid UTF-8, 1 MB
#   number - NaN, +inf, -inf
#   struct - NaN, inf, NUL value, NUL key, invalid UTF-8 value, depth 200, 1 MB
#   time   - year 0, year 10000, negative nanos
#   enum   - an unknown value (99)
#   size   - a negative count or width

FIELDS: list[tuple[str, str, str]] = [
    (SEL + "Select", "endpoint", "lookup"),
    (SEL + "Select", "user_id", "text"),
    (SEL + "Select", "session_id", "text"),
    (SEL + "Select", "context", "struct"),
    (SEL + "SelectBatch", "requests[1].endpoint", "lookup"),
    (SEL + "SelectBatch", "requests[1].user_id", "text"),
    (SEL + "SelectBatch", "requests[1].context", "struct"),
    (SEL + "Update", "decision_id", "lookup"),
    (SEL + "Update", "feedback_id", "text"),
    (SEL + "Update", "reward", "number"),
    (ADMIN + "CreateEndpoint", "endpoint.name", "name"),
    (ADMIN + "CreateEndpoint", "endpoint.description", "text"),
    (ADMIN + "CreateEndpoint", "endpoint.arms[0].arm_id", "name"),
    (ADMIN + "CreateEndpoint", "endpoint.arms[0].params", "struct"),
    (ADMIN + "CreateEndpoint", "endpoint.arms[0].traffic_cap", "number"),
    (ADMIN + "CreateEndpoint", "endpoint.arms[0].status", "enum"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.kind", "enum"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.allocation", "enum"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.exploration_floor", "number"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.half_life_s", "number"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.half_life_s", "size"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.sticky_ttl_s", "size"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.segment_key", "text"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.incumbent.min_pulls", "size"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.incumbent.max_interval_width", "size"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.canary.min_pulls", "size"),
    (ADMIN + "CreateEndpoint", "endpoint.policy.canary.promote_probability", "number"),
    (ADMIN + "GetEndpoint", "name", "lookup"),
    (ADMIN + "UpdateEndpoint", "endpoint.name", "lookup"),
    (ADMIN + "UpdateEndpoint", "endpoint.description", "text"),
    (ADMIN + "UpdateEndpoint", "endpoint.arms[0].params", "struct"),
    (ADMIN + "UpdateEndpoint", "endpoint.policy.kind", "enum"),
    (ADMIN + "UpdateEndpoint", "endpoint.policy.exploration_floor", "number"),
    (ADMIN + "AddArm", "endpoint", "lookup"),
    (ADMIN + "AddArm", "arm.arm_id", "name"),
    (ADMIN + "AddArm", "arm.params", "struct"),
    (ADMIN + "AddArm", "arm.traffic_cap", "number"),
    (ADMIN + "AddArm", "arm.status", "enum"),
    (ADMIN + "RetireArm", "endpoint", "lookup"),
    (ADMIN + "RetireArm", "arm_id", "lookup"),
    (OPE + "EstimatePolicyValue", "endpoint", "lookup"),
    (OPE + "EstimatePolicyValue", "since", "time"),
    (OPE + "EstimatePolicyValue", "until", "time"),
    (OPE + "EstimatePolicyValue", "confidence", "number"),
    (RUN + "StartRun", "config", "runstruct"),
    (RUN + "GetRun", "run_id", "lookup"),
    (RUN + "WatchRun", "run_id", "lookup"),
    (RUN + "CancelRun", "run_id", "lookup"),
    (RUN + "ListRuns", "limit", "size"),
    (RUN + "ListRuns", "state", "enum"),
    (RUN + "GetRunArtifact", "run_id", "lookup"),
    (RUN + "GetRunArtifact", "name", "lookup"),
    (RUN + "ListRunCandidates", "run_id", "lookup"),
    (RUN + "ListRunCandidates", "min_generation", "size"),
    (TS + "Ingest", "batch.meta.event_id", "text"),
    (TS + "Ingest", "batch.spans[0].trace_id", "name"),
    (TS + "Ingest", "batch.spans[0].span_id", "name"),
    (TS + "Ingest", "batch.spans[0].agent", "name"),
    (TS + "Ingest", "batch.spans[0].name", "text"),
    (TS + "Ingest", "batch.spans[0].user_id", "text"),
    (TS + "Ingest", "batch.spans[0].decision_id", "text"),
    (TS + "Ingest", "batch.spans[0].start_time", "time"),
    (TS + "Ingest", "batch.spans[0].end_time", "time"),
    (TS + "Ingest", "batch.spans[0].kind", "enum"),
    (TS + "Ingest", "batch.spans[0].status", "enum"),
    (TS + "Ingest", "batch.spans[0].attributes", "struct"),
    (TS + "Ingest", "batch.spans[0].cost_usd", "number"),
    (TS + "Ingest", "batch.spans[0].reward", "number"),
    (TS + "Ingest", "batch.spans[0].input_tokens", "size"),
    (TS + "GetTrace", "trace_id", "lookup"),
    (TS + "QueryTraces", "agent", "filter"),
    (TS + "QueryTraces", "endpoint", "filter"),
    (TS + "QueryTraces", "text", "filter"),
    (TS + "QueryTraces", "start_after", "time"),
    (TS + "QueryTraces", "start_before", "time"),
    (TS + "QueryTraces", "min_reward", "number"),
    (TS + "QueryTraces", "page.page_size", "size"),
    (TS + "QueryTraces", "status", "enum"),
    (TS + "GetDecision", "decision_id", "lookup"),
    (TS + "ExportDataset", "kind", "enum"),
    (TS + "ExportDataset", "validation_fraction", "number"),
    (TS + "ExportDataset", "min_reward", "number"),
    (TS + "ExportDataset", "filter.start_after", "time"),
    (TS + "DeleteTraces", "trace_id", "filter"),
    (JUDGE + "Score", "prompt", "text"),
    (JUDGE + "Score", "response", "text"),
    (JUDGE + "Score", "reference", "text"),
    (JUDGE + "Score", "rubric", "lookup"),
    (JUDGE + "Score", "rubric_version", "size"),
    (JUDGE + "Score", "judge", "enum"),
    (JUDGE + "Score", "human_score", "number"),
    (JUDGE + "Rank", "prompt", "text"),
    (JUDGE + "Rank", "responses[1]", "text"),
    (JUDGE + "Rank", "judge", "enum"),
    (JUDGE + "Compare", "response_a", "text"),
    (JUDGE + "Compare", "response_b", "text"),
    (JUDGE + "Compare", "judge", "enum"),
    (JUDGE + "Compare", "rubric", "lookup"),
    (JUDGE + "Aggregate", "candidates[0].signals[0].value", "number"),
    (JUDGE + "Aggregate", "candidates[0].signals[0].weight", "number"),
    (JUDGE + "Aggregate", "candidates[0].signals[0].max", "number"),
    (JUDGE + "Aggregate", "candidates[0].id", "text"),
    (JUDGE + "Aggregate", "method", "enum"),
    (JUDGE + "TraceReward", "spans[0].reward", "number"),
    (JUDGE + "TraceReward", "spans[0].attributes", "struct"),
    (JUDGE + "TraceReward", "spans[0].kind", "enum"),
    (JUDGE + "TraceReward", "answer", "text"),
    (JUDGE + "TraceReward", "method", "enum"),
    (JUDGE + "GetRubric", "name", "lookup"),
    (JUDGE + "GetRubric", "version", "size"),
    (JUDGE + "PutRubric", "yaml", "text"),
    (JUDGE + "GetReliability", "judge_id", "filter"),
    (TRAINER + "GetPolicy", "policy_id", "lookup"),
    (TRAINER + "ListPolicies", "name", "filter"),
    (TRAINER + "SetPolicyStatus", "policy_id", "lookup"),
    (TRAINER + "SetPolicyStatus", "status", "enum"),
    (TRAINER + "SetPolicyStatus", "reason", "text"),
    (TRAINER + "SetPolicyStatus", "actor", "text"),
    (TRAINER + "RegisterPolicy", "name", "name"),
    (TRAINER + "RegisterPolicy", "kind", "enum"),
    (TRAINER + "RegisterPolicy", "base_model", "text"),
    (TRAINER + "RegisterPolicy", "checkpoint_uri", "text"),
    (TRAINER + "RegisterPolicy", "dataset_uri", "text"),
    (TRAINER + "RegisterPolicy", "job_id", "text"),
    (TRAINER + "RegisterPolicy", "parent_policy_id", "text"),
    (TRAINER + "RegisterPolicy", "reason", "text"),
    (TRAINER + "PromotePolicy", "policy_id", "lookup"),
    (TRAINER + "PromotePolicy", "actor", "text"),
    (TRAINER + "RollbackPolicy", "name", "lookup"),
]

Mutate = Callable[[Message], bytes | Message]


def _set(path: str, value: Any) -> Mutate:
    return lambda msg: put(msg, path, value)


def _put_made(path: str, make: Callable[[], Message]) -> Mutate:
    return lambda msg: put(msg, path, make())


def _kinds(path: str, category: str) -> list[tuple[str, Mutate, tuple[S, ...]]]:
    """The hostile kinds of one field: (kind id, mutation, status codes that are right)."""
    bad_strings: list[tuple[str, Mutate, tuple[S, ...]]] = [
        ("nul", _set(path, "a\x00b"), (INVALID,)),
        ("badutf8", lambda msg: with_bad_utf8(msg, path), (INVALID,)),
        ("huge1mb", _set(path, HUGE), (INVALID,)),
    ]
    if category in ("text", "filter"):
        return bad_strings
    if category in ("name", "lookup"):
        codes = (INVALID,) if category == "name" else (INVALID, NOT_FOUND)
        return bad_strings + [(kind, _set(path, value), codes) for kind, value in HOSTILE_NAMES.items()]
    if category == "number":
        return [(k, _set(path, v), (INVALID,)) for k, v in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf))]
    if category == "struct":
        out: list[tuple[str, Mutate, tuple[S, ...]]] = [
            (kind, _put_made(path, make), (INVALID,)) for kind, make in HOSTILE_STRUCTS.items()
        ]
        return [*out, ("badutf8", lambda msg: with_bad_utf8(msg, path, in_struct=True), (INVALID,))]
    if category == "runstruct":
        # A run config must keep its schema, so hostile values go where any dict is allowed.
        def at_request(make: Callable[[], Message]) -> Mutate:
            def mutate(msg: Message) -> Message:
                getattr(msg, path).fields["api"].struct_value.fields["request"].struct_value.CopyFrom(make())
                return msg

            return mutate

        def bad_utf8(msg: Message) -> bytes:
            return swap_marker(at_request(lambda: struct({"x": MARKER}))(msg))

        kinds = [(kind, at_request(make), (INVALID,)) for kind, make in HOSTILE_STRUCTS.items()]
        return [*kinds, ("badutf8", bad_utf8, (INVALID,))]
    if category == "time":
        return [
            ("year0", _set(path, ts(YEAR_0)), (INVALID,)),
            ("year10000", _set(path, ts(YEAR_10000)), (INVALID,)),
            ("negnanos", _set(path, ts(1_700_000_000, -5)), (INVALID,)),
        ]
    if category == "enum":
        return [("enum99", _set(path, 99), (INVALID,))]
    if category == "size":
        return [("negative", _set(path, -1), (INVALID,))]
    raise ValueError(category)


def _leaf(path: str) -> str:
    """The name a message should use for the field: its last step without an index."""
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


# What a lookup's NOT_FOUND may call the thing it did not find, when the field is "name".
_ENTITY = {"GetEndpoint": "endpoint", "GetRubric": "rubric", "GetRunArtifact": "artifact"}


def _names(method: Method, path: str) -> tuple[str, ...]:
    """Ways a message may name the field: "run_id", "run id", or the thing looked up ("run")."""
    leaf = _leaf(path)
    names = {leaf, leaf.replace("_", " ")}
    if leaf.endswith("_id"):
        names.add(leaf.removesuffix("_id"))
    if leaf == "name" and method.name in _ENTITY:
        names.add(_ENTITY[method.name])
    if leaf == "name" and "." in path:  # endpoint.name: "endpoint 'x' does not exist"
        names.add(_leaf(path.rsplit(".", 1)[0]))
    if path.startswith("config"):  # a run config: hostile values go to api.request
        names.add("request")
    return tuple(sorted(names))


@dataclass(frozen=True)
class GrpcCase:
    id: str
    method: Method
    mutate: Callable[[Ctx, Message], Awaitable[bytes | Message]] | None  # None: raw bytes below
    raw: bytes
    codes: tuple[S, ...]
    words: tuple[str, ...]  # the error message must contain one of these (the field's name)


def _field_case(method: Method, path: str, kind: str, mutate: Mutate, codes: tuple[S, ...]) -> GrpcCase:
    async def apply(c: Ctx, msg: Message) -> bytes | Message:
        return mutate(msg)

    return GrpcCase(f"{method.name}-{path}-{kind}", method, apply, b"", codes, _names(method, path))


def _explicit(path: str, kind: str, fix: Callable[[Ctx, Message], Any], codes: tuple[S, ...], words: str) -> GrpcCase:
    """A hand-written case: ``fix`` changes the valid request in place (or returns a new one)."""

    async def apply(c: Ctx, msg: Message) -> bytes | Message:
        out = fix(c, msg)
        if asyncio.iscoroutine(out):
            out = await out
        # Only a whole new request replaces the valid one (append() and the like return other things).
        return out if isinstance(out, type(msg)) else msg

    return GrpcCase(f"{M[path].name}-{kind}", M[path], apply, b"", codes, (words, words.replace("_", " ")))


def _arms(msg: Message) -> Any:
    return msg.endpoint.arms


async def _existing_endpoint(c: Ctx, msg: Message) -> None:
    msg.endpoint.name = c.endpoint


async def _unknown_decision(c: Ctx, msg: Message) -> None:
    msg.decision_id = "0" * 12 + "f" * 20


async def _reward_huge_on_gaussian(c: Ctx, msg: Message) -> None:
    # Bounded endpoints clip rewards to [0, 1] (documented, and counted: test_rewards.py); an
    # unbounded one must refuse a reward its posterior cannot hold (1e300 made it NaN).
    msg.decision_id = (await c.select(c.gauss_endpoint)).decision_id
    await asyncio.sleep(0.1)
    msg.reward = 1e300


def _nan_signal_weight(c: Ctx, msg: Message) -> None:
    msg.endpoint.reward_spec.signal_weights.update({"thumbs": math.nan})
    msg.endpoint.reward_spec.bounded = True  # a Beta endpoint needs bounded rewards


def _many_selects(c: Ctx, msg: Message) -> Message:
    return sel_pb.SelectBatchRequest(requests=[sel_pb.SelectRequest(endpoint=c.endpoint)] * 100_000)


def _run_config(change: Callable[[dict[str, Any]], None]) -> Callable[[Ctx, Message], Message]:
    def fix(c: Ctx, msg: Message) -> Message:
        config = run_config()
        change(config)
        return run_pb.StartRunRequest(config=struct(config))

    return fix


def _yaml(text: str) -> Callable[[Ctx, Message], Message]:
    return lambda c, msg: judge_pb.PutRubricRequest(yaml=text)


ALIAS_BOMB = (
    'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    + "name: bomb\ncriteria: *i\n"
)

EXPLICIT: list[GrpcCase] = [
    _explicit(
        SEL + "Select",
        "unknown-endpoint",
        lambda c, m: setattr(m, "endpoint", "no-such-endpoint"),
        (NOT_FOUND,),
        "endpoint",
    ),
    _explicit(SEL + "Select", "empty-endpoint", lambda c, m: setattr(m, "endpoint", ""), (INVALID,), "endpoint"),
    _explicit(
        SEL + "Select", "user_id-300-chars", lambda c, m: setattr(m, "user_id", "u" * 300), (INVALID,), "user_id"
    ),
    _explicit(SEL + "SelectBatch", "empty", lambda c, m: m.ClearField("requests"), (INVALID,), "request"),
    _explicit(SEL + "SelectBatch", "100k-requests", _many_selects, (INVALID,), "requests"),
    _explicit(SEL + "Update", "unknown-decision", _unknown_decision, (NOT_FOUND, INVALID), "decision"),
    _explicit(SEL + "Update", "reward-1e300-on-gaussian", _reward_huge_on_gaussian, (INVALID,), "reward"),
    _explicit(SEL + "Update", "signal-nan", lambda c, m: m.signals.update({"thumbs": math.nan}), (INVALID,), "signals"),
    _explicit(SEL + "Update", "signal-key-nul", lambda c, m: m.signals.update({"a\x00b": 1.0}), (INVALID,), "signals"),
    _explicit(ADMIN + "CreateEndpoint", "existing-name", _existing_endpoint, (EXISTS,), "endpoint"),
    _explicit(
        ADMIN + "CreateEndpoint",
        "duplicate-arm-ids",
        lambda c, m: setattr(_arms(m)[1], "arm_id", _arms(m)[0].arm_id),
        (INVALID,),
        "arm",
    ),
    _explicit(ADMIN + "CreateEndpoint", "no-arms", lambda c, m: m.endpoint.ClearField("arms"), (INVALID,), "arm"),
    _explicit(
        ADMIN + "CreateEndpoint",
        "reward-weight-nan",
        _nan_signal_weight,
        (INVALID,),
        "signal_weights",
    ),
    _explicit(
        ADMIN + "CreateEndpoint",
        "floor-above-1",
        lambda c, m: setattr(m.endpoint.policy, "exploration_floor", 2.0),
        (INVALID,),
        "exploration_floor",
    ),
    _explicit(
        ADMIN + "CreateEndpoint",
        "context-feature-nul",
        lambda c, m: m.endpoint.policy.context_features.append("a\x00b"),
        (INVALID,),
        "context_features",
    ),
    _explicit(
        ADMIN + "UpdateEndpoint",
        "unknown-endpoint",
        lambda c, m: setattr(m.endpoint, "name", "no-such-endpoint"),
        (NOT_FOUND,),
        "endpoint",
    ),
    _explicit(
        ADMIN + "AddArm",
        "existing-arm",
        lambda c, m: setattr(m.arm, "arm_id", "small") or setattr(m, "endpoint", c.endpoint),
        (EXISTS,),
        "arm",
    ),
    _explicit(
        ADMIN + "AddArm",
        "unknown-endpoint",
        lambda c, m: setattr(m, "endpoint", "no-such-endpoint"),
        (NOT_FOUND,),
        "endpoint",
    ),
    _explicit(
        ADMIN + "RetireArm", "unknown-arm", lambda c, m: setattr(m, "arm_id", "no-such-arm"), (NOT_FOUND,), "arm"
    ),
    _explicit(
        OPE + "EstimatePolicyValue",
        "unknown-endpoint",
        lambda c, m: setattr(m, "endpoint", "no-such-endpoint"),
        (NOT_FOUND,),
        "endpoint",
    ),
    _explicit(
        OPE + "EstimatePolicyValue",
        "confidence-1.5",
        lambda c, m: setattr(m, "confidence", 1.5),
        (INVALID,),
        "confidence",
    ),
    _explicit(
        OPE + "EstimatePolicyValue",
        "distribution-nan",
        lambda c, m: m.candidate.distribution.probabilities.update({"small": math.nan}),
        (INVALID,),
        "probabilit",
    ),
    _explicit(
        OPE + "EstimatePolicyValue",
        "distribution-unknown-arm",
        lambda c, m: m.candidate.distribution.probabilities.update({"../../etc/passwd": 0.0}),
        (INVALID,),
        "arm",
    ),
    _explicit(
        OPE + "EstimatePolicyValue",
        "unknown-arm",
        lambda c, m: m.candidate.CopyFrom(ope_pb.CandidatePolicy(arm_id="nope")),
        (INVALID, NOT_FOUND),
        "arm",
    ),
    _explicit(RUN + "StartRun", "empty-config", lambda c, m: run_pb.StartRunRequest(), (INVALID,), "api"),
    _explicit(
        RUN + "StartRun",
        "population-1e6",
        _run_config(lambda cfg: cfg["optimization"]["evolution"].update(population=1_000_000)),
        (INVALID,),
        "population",
    ),
    _explicit(
        RUN + "StartRun",
        "generations-negative",
        _run_config(lambda cfg: cfg["optimization"]["evolution"].update(generations=-1)),
        (INVALID,),
        "generations",
    ),
    _explicit(
        RUN + "StartRun",
        "callable-builtins-exec",
        _run_config(lambda cfg: cfg["api"].update(callable="builtins:exec")),
        (INVALID,),
        "callable",
    ),
    _explicit(
        RUN + "StartRun",
        "callable-os-system",
        _run_config(lambda cfg: cfg["api"].update(callable="os:system")),
        (INVALID,),
        "callable",
    ),
    _explicit(
        RUN + "StartRun",
        "token-env-db-password",
        _run_config(
            lambda cfg: cfg.update(
                api={
                    "name": "x",
                    "kind": "http",
                    "endpoint": "http://127.0.0.1:9/x",
                    "auth": {"type": "bearer", "token_env": "FLYWHEEL_DB_PASSWORD"},
                }
            )
        ),
        (INVALID,),
        "token_env",
    ),
    _explicit(RUN + "StartRun", "unknown-key", _run_config(lambda cfg: cfg.update({"$(id)": 1})), (INVALID,), "$(id)"),
    _explicit(RUN + "GetRun", "unknown-run", lambda c, m: setattr(m, "run_id", "no-such-run"), (NOT_FOUND,), "run"),
    _explicit(RUN + "CancelRun", "unknown-run", lambda c, m: setattr(m, "run_id", "no-such-run"), (NOT_FOUND,), "run"),
    _explicit(RUN + "WatchRun", "unknown-run", lambda c, m: setattr(m, "run_id", "no-such-run"), (NOT_FOUND,), "run"),
    _explicit(
        RUN + "ListRunCandidates", "unknown-run", lambda c, m: setattr(m, "run_id", "no-such-run"), (NOT_FOUND,), "run"
    ),
    _explicit(
        RUN + "GetRunArtifact",
        "unknown-artifact",
        lambda c, m: setattr(m, "name", "secrets.env"),
        (NOT_FOUND, INVALID),
        "artifact",
    ),
    _explicit(RUN + "ListRuns", "limit-1e9", lambda c, m: setattr(m, "limit", 1_000_000_000), (INVALID, OK), "limit"),
    # No duplicate-span-id case: ingest is idempotent by (trace_id, span_id) and answers a
    # repeated span with spans_duplicate, by design.
    _explicit(
        TS + "Ingest",
        "parent-cycle",
        lambda c, m: m.batch.spans.extend(
            [
                span(m.batch.spans[0].trace_id, "b" * 16, parent_span_id="c" * 16),
                span(m.batch.spans[0].trace_id, "c" * 16, parent_span_id="b" * 16),
            ]
        ),
        (INVALID,),
        "parent",
    ),
    _explicit(
        TS + "Ingest",
        "end-before-start",
        lambda c, m: setattr(m.batch.spans[0].end_time, "seconds", 1),
        (INVALID,),
        "end_time",
    ),
    _explicit(
        TS + "GetTrace", "unknown-trace", lambda c, m: setattr(m, "trace_id", uuid.uuid4().hex), (NOT_FOUND,), "trace"
    ),
    _explicit(
        TS + "GetDecision",
        "unknown-decision",
        lambda c, m: setattr(m, "decision_id", "f" * 32),
        (NOT_FOUND,),
        "decision",
    ),
    _explicit(
        TS + "QueryTraces",
        "bad-page-token",
        lambda c, m: setattr(m.page, "page_token", "../../etc/passwd"),
        (INVALID,),
        "page_token",
    ),
    _explicit(
        TS + "ExportDataset",
        "validation-fraction-1.5",
        lambda c, m: setattr(m, "validation_fraction", 1.5),
        (INVALID,),
        "validation_fraction",
    ),
    _explicit(
        JUDGE + "Score", "human-score-nan", lambda c, m: setattr(m, "human_score", math.nan), (INVALID,), "human_score"
    ),
    _explicit(
        JUDGE + "Score",
        "unknown-rubric",
        lambda c, m: setattr(m, "rubric", "no_such_rubric"),
        (INVALID, NOT_FOUND),
        "rubric",
    ),
    _explicit(
        JUDGE + "Rank", "10k-responses", lambda c, m: m.responses.extend(["r"] * 10_000), (INVALID,), "responses"
    ),
    _explicit(
        JUDGE + "Aggregate",
        "duplicate-ids",
        lambda c, m: setattr(m.candidates[1], "id", m.candidates[0].id),
        (INVALID,),
        "id",
    ),
    _explicit(
        JUDGE + "GetRubric", "unknown-rubric", lambda c, m: setattr(m, "name", "no_such_rubric"), (NOT_FOUND,), "rubric"
    ),
    _explicit(JUDGE + "PutRubric", "alias-bomb", _yaml(ALIAS_BOMB), (INVALID,), "yaml"),
    _explicit(
        JUDGE + "PutRubric",
        "yaml-1mb",
        _yaml("name: big\ndescription: " + "x" * (1024 * 1024) + "\n"),
        (INVALID,),
        "yaml",
    ),
    _explicit(
        JUDGE + "PutRubric",
        "yaml-weight-nan",
        _yaml("name: nanrubric\ncriteria:\n  - {name: a, description: d, weight: .nan}\n"),
        (INVALID,),
        "weight",
    ),
    _explicit(
        JUDGE + "PutRubric",
        "yaml-path-name",
        _yaml("name: ../../etc/passwd\ncriteria:\n  - {name: a, description: d, weight: 1}\n"),
        (INVALID,),
        "name",
    ),
    _explicit(
        JUDGE + "PutRubric",
        "yaml-python-tag",
        _yaml("name: !!python/object/apply:os.system ['id']\ncriteria:\n  - {name: a, description: d, weight: 1}\n"),
        (INVALID,),
        "yaml",
    ),
    _explicit(
        JUDGE + "PutRubric",
        "message-weight-inf",
        lambda c, m: (lambda r: (setattr(r.rubric.criteria[0], "weight", math.inf), r)[1])(good_put_rubric_message()),
        (INVALID,),
        "weight",
    ),
    _explicit(
        JUDGE + "PutRubric",
        "message-name-sql",
        lambda c, m: (lambda r: (setattr(r.rubric, "name", "a'; DROP TABLE x;--"), r)[1])(good_put_rubric_message()),
        (INVALID,),
        "name",
    ),
    _explicit(
        TRAINER + "RegisterPolicy", "metric-nan", lambda c, m: m.metrics.update({"x": math.nan}), (INVALID,), "metrics"
    ),
    _explicit(
        TRAINER + "RegisterPolicy",
        "metric-key-nul",
        lambda c, m: m.metrics.update({"a\x00b": 1.0}),
        (INVALID,),
        "metrics",
    ),
    _explicit(TRAINER + "RegisterPolicy", "kind-unset", lambda c, m: m.ClearField("kind"), (INVALID,), "kind"),
    _explicit(
        TRAINER + "RegisterPolicy",
        "parent-unknown",
        lambda c, m: setattr(m, "parent_policy_id", "0" * 32),
        (INVALID,),
        "parent_policy_id",
    ),
    _explicit(TRAINER + "SetPolicyStatus", "status-unset", lambda c, m: m.ClearField("status"), (INVALID,), "status"),
    _explicit(
        TRAINER + "SetPolicyStatus",
        "unknown-policy",
        lambda c, m: setattr(m, "policy_id", "0" * 32),
        (NOT_FOUND,),
        "policy_id",
    ),
    _explicit(
        TRAINER + "SetPolicyStatus",
        "registered-to-rolled-back",
        lambda c, m: setattr(m, "status", jobs_pb2.POLICY_STATUS_ROLLED_BACK),
        (S.FAILED_PRECONDITION,),
        "rule",
    ),
    _explicit(
        TRAINER + "RollbackPolicy",
        "nothing-active",
        _nothing_active,
        (S.FAILED_PRECONDITION,),
        "rule",
    ),
]


def grpc_cases() -> Iterator[GrpcCase]:
    for method in M.values():
        for kind, raw in (("truncated", TRUNCATED), ("badwire", BAD_WIRE_TYPE)):
            # The message must say the request did not decode; "request" is the word to find.
            yield GrpcCase(f"{method.name}-undecodable-{kind}", method, None, raw, (INVALID,), ("request",))
    for path, fld, category in FIELDS:
        for kind, mutate, codes in _kinds(fld, category):
            yield _field_case(M[path], fld, kind, mutate, codes)
    yield from EXPLICIT


GRPC_CASES = list(grpc_cases())
assert len({c.id for c in GRPC_CASES}) == len(GRPC_CASES), "case ids must be unique"


async def all_serving(c: Ctx) -> dict[str, str]:
    statuses = {}
    for name, channel in c.channels.items():
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            statuses[name] = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        except grpc.RpcError as exc:
            statuses[name] = f"UNREACHABLE ({exc.code().name})"
    return statuses


async def good_call_succeeds(c: Ctx, method: Method) -> None:
    request = await method.good(c)
    outcome = await call_raw(c.channels[method.service], method.path, request.SerializeToString(), method.shape)
    assert outcome.code == OK, f"valid {method.name} after the bad one: {outcome.code.name} {outcome.details[:300]}"


def check_refusal(outcome: Outcome, codes: tuple[S, ...], words: tuple[str, ...]) -> None:
    shown = f"{outcome.code.name}: {outcome.details[:400]!r}"
    assert outcome.code in codes, f"expected {'/'.join(c.name for c in codes)}, got {shown}"
    assert not leaks(outcome.details), f"internals in the message {leaks(outcome.details)}: {shown}"
    if outcome.code != OK:
        found = outcome.details.lower()
        assert any(w.lower() in found for w in words), f"message names none of {words}: {shown}"


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c.id for c in GRPC_CASES])
async def test_grpc_hostile_request(ctx: Ctx, case: GrpcCase) -> None:
    if case.mutate is None:
        payload = case.raw
    else:
        request = await case.method.good(ctx)
        bad = await case.mutate(ctx, request)
        payload = bad if isinstance(bad, bytes) else bad.SerializeToString()
    outcome = await call_raw(ctx.channels[case.method.service], case.method.path, payload, case.method.shape)
    check_refusal(outcome, case.codes, case.words)
    await good_call_succeeds(ctx, case.method)
    assert await all_serving(ctx) == dict.fromkeys(ctx.channels, "SERVING")


TRAINER_CASES = [(name, kind) for name in TRAINER_REQUESTS for kind in ("valid", "undecodable")]


@pytest.mark.parametrize(("name", "kind"), TRAINER_CASES, ids=[f"{n}-{k}" for n, k in TRAINER_CASES])
async def test_trainer_job_methods_refuse_hostile_requests_cleanly(ctx: Ctx, name: str, kind: str) -> None:
    request, code, word = TRAINER_REQUESTS[name]
    payload = request.SerializeToString() if kind == "valid" else TRUNCATED
    outcome = await call_raw(ctx.channels["trainer"], TRAINER + name.split("-")[0], payload)
    # Undecodable bytes are refused at the door, before the method (as for every servicer).
    expected = getattr(S, {"INVALID": "INVALID_ARGUMENT"}.get(code, code)) if kind == "valid" else INVALID
    assert outcome.code == expected, f"{outcome.code.name}: {outcome.details[:300]!r}"
    if kind == "valid" and word:
        assert word in outcome.details, outcome.details[:300]
    assert not leaks(outcome.details), outcome.details
    assert await all_serving(ctx) == dict.fromkeys(ctx.channels, "SERVING")


# ---------------------------------------------------------------------------------------
# The bus: a bad event published with the admin connection is dead-lettered, with a
# reason, by every consumer of its subject; a good event published right behind it (so
# both are usually fetched together) is processed.

JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class BusCase:
    id: str
    subject: Callable[[Catalogue], str]
    consumers: tuple[str, ...]
    bad: Callable[[Ctx], Awaitable[tuple[bytes, dict[str, str]]]]
    good: Callable[[Ctx], Awaitable[tuple[bytes, Callable[[], Awaitable[bool]]]]]


def proto(msg: Message) -> tuple[bytes, dict[str, str]]:
    return msg.SerializeToString(), {}


# Valid events and how to see that each was processed.


async def good_feedback(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    decision = await c.select()
    await asyncio.sleep(0.1)
    event_id = uid("fb")
    event = opt_events.FeedbackEvent(meta=EventMeta(event_id=event_id), decision_id=decision.decision_id, reward=1.0)

    async def seen() -> bool:
        try:
            got = await c.stub_call(
                "trace_store",
                TS + "GetDecision",
                ts_pb.GetDecisionRequest(decision_id=decision.decision_id),
                ts_pb.GetDecisionResponse,
            )
        except grpc.aio.AioRpcError:
            return False
        rows = await c.fetch("SELECT 1 FROM applied_feedback WHERE event_id = $1", event_id)
        return any(f.event_id == event_id for f in got.decision.feedback) and bool(rows)

    return event.SerializeToString(), seen


async def good_spans(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    batch = span_batch()

    async def seen() -> bool:
        outcome = await call_raw(
            c.channels["trace_store"],
            TS + "GetTrace",
            ts_pb.GetTraceRequest(trace_id=batch.spans[0].trace_id).SerializeToString(),
        )
        return outcome.code == OK

    return batch.SerializeToString(), seen


async def good_decisions(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    decision_id = f"{int(time.time() * 1000):012x}{uuid.uuid4().hex[:20]}"
    batch = opt_events.DecisionBatch(
        meta=EventMeta(event_id=uid("dec")),
        decisions=[
            opt_events.DecisionEvent(decision_id=decision_id, endpoint=c.endpoint, arm_id="small", probability=0.5)
        ],
    )

    async def seen() -> bool:
        outcome = await call_raw(
            c.channels["trace_store"],
            TS + "GetDecision",
            ts_pb.GetDecisionRequest(decision_id=decision_id).SerializeToString(),
        )
        return outcome.code == OK

    return batch.SerializeToString(), seen


def evaluation_request(run_id: str = "hostile-run", request_id: str | None = None) -> eval_pb.EvaluationRequest:
    return eval_pb.EvaluationRequest(
        meta=EventMeta(event_id=uid("ev")),
        request_id=request_id or uid("req"),
        run_id=run_id,
        candidate_id="c1",
        config=struct({"prefix": ""}),
        test_case=eval_pb.TestCase(
            test_case_id="t1", input=struct({"question": "2+2?"}), expected=struct({"answer": "2+2?"})
        ),
        target=eval_pb.Target(python_callable="flywheel.evaluator.examples:echo"),
        metrics=[eval_pb.Metric(name="correct", type=eval_pb.METRIC_TYPE_EXACT_MATCH, weight=1.0)],
        timeout_s=10,
    )


async def good_evaluation_request(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    req = evaluation_request()

    async def seen() -> bool:
        result = c.results.get(req.request_id)
        return result is not None and not result.error

    return req.SerializeToString(), seen


def evaluation_result(c: Ctx, request_id: str | None = None) -> eval_pb.EvaluationResult:
    return eval_pb.EvaluationResult(
        meta=EventMeta(event_id=uid("res")),
        request_id=request_id or uid("req"),
        run_id=c.results_run,
        candidate_id=c.results_candidate,
        test_case_id=uid("case"),
        score=0.5,
        output="ok",
    )


async def good_evaluation_result(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    result = evaluation_result(c)

    async def seen() -> bool:
        return bool(await c.fetch("SELECT 1 FROM run_evaluations WHERE request_id = $1", result.request_id))

    return result.SerializeToString(), seen


def proposal(c: Ctx) -> society_pb.ProposalEvent:
    return society_pb.ProposalEvent(
        meta=EventMeta(event_id=uid("prop")),
        run_id=c.proposals_run,
        config=struct({"prefix": "", "delay_s": 30.0}),
        source=society_pb.PROPOSAL_SOURCE_EXTERNAL,
    )


async def good_proposal(c: Ctx) -> tuple[bytes, Callable[[], Awaitable[bool]]]:
    event = proposal(c)

    async def seen() -> bool:
        return bool(await c.fetch("SELECT 1 FROM run_injections WHERE injection_id = $1", event.meta.event_id))

    return event.SerializeToString(), seen


# Bad events, per subject: (kind, builder).


def _fb(c: Ctx, decision_id: str, **kw: Any) -> opt_events.FeedbackEvent:
    meta = kw.pop("meta", None) or EventMeta(event_id=uid("fb"))
    return opt_events.FeedbackEvent(meta=meta, decision_id=decision_id, **kw)


def bad_feedback() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def on_decision(build: Callable[[Ctx, str], Message | bytes]) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            decision = await c.select()
            await asyncio.sleep(0.1)
            out = build(c, decision.decision_id)
            if isinstance(out, tuple):
                return out
            return (out, {}) if isinstance(out, bytes) else proto(out)

        return make

    return [
        ("bad-json", lambda c: _ret(b'{"decisionId": "x", "reward": ', JSON)),
        ("json-wrong-types", lambda c: _ret(b'{"decisionId": 42, "reward": "high"}', JSON)),
        ("wrong-message-type", lambda c: _ret(span_batch().SerializeToString(), {})),
        ("undecodable", lambda c: _ret(TRUNCATED, {})),
        ("event-id-10k-chars", on_decision(lambda c, d: _fb(c, d, meta=EventMeta(event_id="e" * 10_000), reward=1.0))),
        ("event-id-nul", on_decision(lambda c, d: _fb(c, d, meta=EventMeta(event_id="fb\x00x"), reward=1.0))),
        (
            "event-id-bad-utf8",
            on_decision(lambda c, d: with_bad_utf8(_fb(c, d, reward=1.0), "meta.event_id")),
        ),
        ("no-event-id", on_decision(lambda c, d: _fb(c, d, meta=EventMeta(), reward=1.0))),
        (
            "time-year-10000",
            on_decision(lambda c, d: _fb(c, d, meta=EventMeta(event_id=uid(), time=ts(YEAR_10000)), reward=1.0)),
        ),
        (
            "time-year-0",
            on_decision(lambda c, d: _fb(c, d, meta=EventMeta(event_id=uid(), time=ts(YEAR_0)), reward=1.0)),
        ),
        (
            "time-negative-nanos",
            on_decision(lambda c, d: _fb(c, d, meta=EventMeta(event_id=uid(), time=ts(1_700_000_000, -1)), reward=1.0)),
        ),
        ("reward-nan", on_decision(lambda c, d: _fb(c, d, reward=math.nan))),
        ("reward-inf", on_decision(lambda c, d: _fb(c, d, reward=math.inf))),
        ("signal-nan", on_decision(lambda c, d: _fb(c, d, signals={"thumbs": math.nan}))),
        ("unknown-decision", lambda c: _ret(*proto(_fb(c, "0" * 12 + "e" * 20, reward=1.0)))),
        ("decision-id-sql", lambda c: _ret(*proto(_fb(c, "a'; DROP TABLE x;--", reward=1.0)))),
        ("endpoint-mismatch", on_decision(lambda c, d: _fb(c, d, reward=1.0, endpoint=c.update_endpoint))),
        (
            "json-nan-reward",
            on_decision(
                lambda c, d: (
                    b'{"meta": {"eventId": "%s"}, "decisionId": "%s", "reward": "NaN"}' % (uid().encode(), d.encode()),
                    JSON,
                )
            ),
        ),
    ]


async def _ret(payload: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return payload, headers


def bad_spans() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def with_span(change: Callable[[spans_pb2.SpanBatch], Any]) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            batch = span_batch()
            out = change(batch)
            return (out, {}) if isinstance(out, bytes) else proto(batch)

        return make

    s0 = "spans[0]"
    return [
        ("bad-json", lambda c: _ret(b'{"spans": [', JSON)),
        ("undecodable", lambda c: _ret(BAD_WIRE_TYPE, {})),
        ("event-id-10k-chars", with_span(lambda b: setattr(b.meta, "event_id", "e" * 10_000))),
        ("event-id-nul", with_span(lambda b: setattr(b.meta, "event_id", "b\x00x"))),
        ("span-id-nul", with_span(lambda b: setattr(b.spans[0], "span_id", "s\x00"))),
        ("trace-id-10k-chars", with_span(lambda b: setattr(b.spans[0], "trace_id", "t" * 10_000))),
        ("name-bad-utf8", with_span(lambda b: with_bad_utf8(b, f"{s0}.name"))),
        ("start-year-10000", with_span(lambda b: b.spans[0].start_time.CopyFrom(ts(YEAR_10000)))),
        ("start-negative-nanos", with_span(lambda b: b.spans[0].start_time.CopyFrom(ts(1_700_000_000, -1)))),
        ("cost-nan", with_span(lambda b: setattr(b.spans[0], "cost_usd", math.nan))),
        ("reward-inf", with_span(lambda b: setattr(b.spans[0], "reward", math.inf))),
        ("attributes-nan", with_span(lambda b: b.spans[0].attributes.CopyFrom(HOSTILE_STRUCTS["nan"]()))),
        ("attributes-deep", with_span(lambda b: b.spans[0].attributes.CopyFrom(HOSTILE_STRUCTS["deep200"]()))),
        ("kind-99", with_span(lambda b: setattr(b.spans[0], "kind", 99))),
    ]


def bad_decisions() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def batch_with(meta: EventMeta | None = None, **kw: Any) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            event = opt_events.DecisionEvent(
                decision_id=uuid.uuid4().hex, endpoint=c.endpoint, arm_id="small", probability=0.5
            )
            for k, v in kw.items():
                put(event, k, v)
            return proto(opt_events.DecisionBatch(meta=meta or EventMeta(event_id=uid("dec")), decisions=[event]))

        return make

    return [
        ("bad-json", lambda c: _ret(b"{not json", JSON)),
        ("undecodable", lambda c: _ret(TRUNCATED, {})),
        ("decision-id-nul", batch_with(decision_id="d\x00x")),
        ("decision-id-10k-chars", batch_with(decision_id="d" * 10_000)),
        ("user-id-10k-chars", batch_with(user_id="u" * 10_000)),
        ("probability-nan", batch_with(probability=math.nan)),
        ("probability-zero", batch_with(probability=0.0)),
        ("probability-negative", batch_with(probability=-0.5)),
        ("context-nan", batch_with(context=HOSTILE_STRUCTS["nan"]())),
        ("context-nul", batch_with(context=HOSTILE_STRUCTS["nul"]())),
        ("time-year-10000", batch_with(meta=EventMeta(event_id=uid("dec"), time=ts(YEAR_10000)))),
        ("time-negative-nanos", batch_with(meta=EventMeta(event_id=uid("dec"), time=ts(1_700_000_000, -7)))),
    ]


def bad_evaluation_requests() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def req_with(change: Callable[[eval_pb.EvaluationRequest], Any]) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            req = evaluation_request()
            out = change(req)
            return (out, {}) if isinstance(out, bytes) else proto(req)

        return make

    return [
        ("bad-json", lambda c: _ret(b'{"requestId": ', JSON)),
        ("undecodable", lambda c: _ret(BAD_WIRE_TYPE, {})),
        ("callable-os-system", req_with(lambda r: setattr(r.target, "python_callable", "os:system"))),
        ("callable-builtins-exec", req_with(lambda r: setattr(r.target, "python_callable", "builtins:exec"))),
        (
            "header-env-secret",
            req_with(
                lambda r: r.target.http.CopyFrom(
                    eval_pb.HttpTarget(
                        url="http://127.0.0.1:9/", header_envs={"Authorization": "FLYWHEEL_NATS_PASSWORD"}
                    )
                )
            ),
        ),
        ("request-id-nul", req_with(lambda r: setattr(r, "request_id", "r\x00x"))),
        ("request-id-10k-chars", req_with(lambda r: setattr(r, "request_id", "r" * 10_000))),
        ("run-id-path", req_with(lambda r: setattr(r, "run_id", "../../etc/passwd"))),
        ("timeout-nan", req_with(lambda r: setattr(r, "timeout_s", math.nan))),
        ("metric-type-99", req_with(lambda r: setattr(r.metrics[0], "type", 99))),
        ("input-nan", req_with(lambda r: r.test_case.input.CopyFrom(HOSTILE_STRUCTS["nan"]()))),
        ("config-deep", req_with(lambda r: r.config.CopyFrom(HOSTILE_STRUCTS["deep200"]()))),
    ]


def bad_evaluation_results() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def result_with(change: Callable[[Ctx, eval_pb.EvaluationResult], Any]) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            result = evaluation_result(c)
            change(c, result)
            return proto(result)

        return make

    return [
        ("bad-json", lambda c: _ret(b"[1, 2", JSON)),
        ("undecodable", lambda c: _ret(TRUNCATED, {})),
        ("score-nan", result_with(lambda c, r: setattr(r, "score", math.nan))),
        ("score-above-1", result_with(lambda c, r: setattr(r, "score", 7.0))),
        ("latency-inf", result_with(lambda c, r: setattr(r, "latency_ms", math.inf))),
        ("component-nan", result_with(lambda c, r: r.components.update({"correct": math.nan}))),
        ("unknown-run", result_with(lambda c, r: setattr(r, "run_id", "no-such-run"))),
        ("test-case-id-nul", result_with(lambda c, r: setattr(r, "test_case_id", "t\x00"))),
        ("request-id-10k-chars", result_with(lambda c, r: setattr(r, "request_id", "r" * 10_000))),
        ("output-nul", result_with(lambda c, r: setattr(r, "output", "a\x00b"))),
    ]


def bad_proposals() -> list[tuple[str, Callable[[Ctx], Any]]]:
    def prop_with(change: Callable[[society_pb.ProposalEvent], Any]) -> Callable[[Ctx], Any]:
        async def make(c: Ctx) -> tuple[bytes, dict[str, str]]:
            event = proposal(c)
            change(event)
            return proto(event)

        return make

    return [
        ("bad-json", lambda c: _ret(b'{"runId"', JSON)),
        ("undecodable", lambda c: _ret(BAD_WIRE_TYPE, {})),
        ("no-event-id", prop_with(lambda e: e.meta.ClearField("event_id"))),
        ("event-id-nul", prop_with(lambda e: setattr(e.meta, "event_id", "p\x00"))),
        ("config-nan", prop_with(lambda e: e.config.CopyFrom(HOSTILE_STRUCTS["nan"]()))),
        ("config-deep", prop_with(lambda e: e.config.CopyFrom(HOSTILE_STRUCTS["deep200"]()))),
        ("config-nul-key", prop_with(lambda e: e.config.CopyFrom(HOSTILE_STRUCTS["nulkey"]()))),
        ("unknown-run", prop_with(lambda e: setattr(e, "run_id", "no-such-run"))),
        ("source-99", prop_with(lambda e: setattr(e, "source", 99))),
    ]


def bus_cases() -> Iterator[BusCase]:
    subjects = [
        (
            "feedback",
            lambda cat: cat.feedback("hostile-ep"),
            ("optimizer-feedback", "trace-store-feedback"),
            bad_feedback(),
            good_feedback,
        ),
        ("traces", lambda cat: cat.traces(AGENT), ("trace-store-traces",), bad_spans(), good_spans),
        (
            "decisions",
            lambda cat: cat.decision("hostile-ep"),
            ("trace-store-decisions",),
            bad_decisions(),
            good_decisions,
        ),
        (
            "evaluation-request",
            lambda cat: cat.evaluation_request("hostile-run"),
            ("evaluator-requests",),
            bad_evaluation_requests(),
            good_evaluation_request,
        ),
        (
            "evaluation-result",
            lambda cat: cat.evaluation_result("hostile-run"),
            ("optimizer-evaluation-results",),
            bad_evaluation_results(),
            good_evaluation_result,
        ),
        (
            "proposal",
            lambda cat: cat.society_proposal("hostile-run"),
            ("optimizer-proposals",),
            bad_proposals(),
            good_proposal,
        ),
    ]
    for name, subject, consumers, bads, good in subjects:
        for kind, bad in bads:
            case_id = f"{name}-{kind}"
            yield BusCase(case_id, subject, ONLY_OPTIMIZER.get(case_id, consumers), bad, good)


# The trace store records feedback whatever its decision (the decision event may come later),
# so only the optimizer, which applies feedback to its decision's arm, refuses these.
ONLY_OPTIMIZER = {
    f"feedback-{kind}": ("optimizer-feedback",) for kind in ("unknown-decision", "decision-id-sql", "endpoint-mismatch")
}


BUS_CASES = list(bus_cases())


async def _letter_for(c: Ctx, payload: bytes, consumer: str, timeout_s: float = 6.0) -> DeadLetter | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for letter in c.letters:
            if letter.consumer == consumer and letter.payload == payload:
                return letter
        await asyncio.sleep(0.05)
    return None


@pytest.mark.parametrize("case", BUS_CASES, ids=[c.id for c in BUS_CASES])
async def test_bus_hostile_event(ctx: Ctx, nats_client, case: BusCase) -> None:
    js = nats_client.jetstream()
    subject = case.subject(ctx.catalogue)
    payload, headers = await case.bad(ctx)
    good_payload, processed = await case.good(ctx)
    # Published back to back so a consumer usually fetches them in one batch.
    await js.publish(subject, payload, headers=headers or None)
    await js.publish(subject, good_payload)

    problems = []
    for consumer in case.consumers:
        letter = await _letter_for(ctx, payload, consumer)
        if letter is None:
            problems.append(f"{consumer}: no dead letter")
        elif not letter.reason.strip() or letter.subject != subject:
            problems.append(f"{consumer}: dead letter without reason or subject: {letter}")
        elif letter.reason.startswith("failed "):
            # Retried until max_deliver: the consumer did not recognise the event as bad.
            problems.append(f"{consumer}: retried, not rejected: {letter.reason[:300]!r}")
    good_letters = [lt for lt in ctx.letters if lt.payload == good_payload]
    if good_letters:
        problems.append(
            f"the good event behind it was dead-lettered: {good_letters[0].consumer}: {good_letters[0].reason[:300]!r}"
        )
    else:
        try:
            await eventually(processed, bool, timeout_s=10.0, interval_s=0.1)
        except AssertionError:
            problems.append("the good event behind it was not processed within 10 s")
    assert not problems, "; ".join(problems)
    assert await all_serving(ctx) == dict.fromkeys(ctx.channels, "SERVING")


def test_the_suite_has_at_least_200_cases() -> None:
    assert len(GRPC_CASES) + len(TRAINER_CASES) + len(BUS_CASES) >= 200


SOCIETY_CASES = [(name, kind) for name in SOCIETY_REQUESTS for kind in ("valid", "undecodable")]


@pytest.mark.parametrize(("name", "kind"), SOCIETY_CASES, ids=[f"society-{n}-{k}" for n, k in SOCIETY_CASES])
async def test_society_methods_refuse_hostile_requests_cleanly(ctx: Ctx, name: str, kind: str) -> None:
    request, code, word = SOCIETY_REQUESTS[name]
    payload = request.SerializeToString() if kind == "valid" else TRUNCATED
    outcome = await call_raw(ctx.channels["society"], SOCIETY + name.split("-")[0], payload)
    expected = getattr(S, {"INVALID": "INVALID_ARGUMENT"}.get(code, code)) if kind == "valid" else INVALID
    assert outcome.code == expected, f"{outcome.code.name}: {outcome.details[:300]!r}"
    if kind == "valid" and word:
        assert word in outcome.details, outcome.details[:300]
    assert not leaks(outcome.details), outcome.details
    assert await all_serving(ctx) == dict.fromkeys(ctx.channels, "SERVING")
