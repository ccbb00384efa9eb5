"""gRPC servicer of the reward judge: validate, call the domain layer, convert."""

from __future__ import annotations

import dataclasses
import math

import grpc

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.api.traces.v1 import spans_pb2
from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import MAX_KEY_CHARS, Invalid, check_enum, check_number, check_string, struct_to_dict
from flywheel.reward_judge import rubric as rubrics
from flywheel.reward_judge.aggregation import Method, Signal, aggregate, pareto_ranks
from flywheel.reward_judge.reliability import StatsSink
from flywheel.reward_judge.rubric_store import RubricStore
from flywheel.reward_judge.service import (
    EMBEDDING,
    HEURISTIC,
    LLM,
    REFERENCE,
    REWARD_MODEL,
    CompareResult,
    Judgement,
    JudgeService,
)
from flywheel.reward_judge.trace_rewards import SpanView, trace_reward
from flywheel.reward_judge.validation import check_text


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """Sizes of the requests the servicer checks itself (RewardJudgeSettings gives them)."""

    rubric_yaml_max_chars: int = 100_000
    rubric_yaml_max_nodes: int = 10_000
    max_aggregate_candidates: int = 10_000
    max_signals_per_candidate: int = 64
    max_trace_spans: int = 100_000
    max_text_chars: int = 100_000


# A candidate id, a span name and a judge_id are names, not texts: as wide as the
# judge_stats.judge_id column (and the trace store's span name) so they stay printable.
MAX_ID_CHARS = 256
MAX_SPAN_NAME_CHARS = 1024
# A span's attributes, serialized: the trace store's limit, so no span it would refuse
# makes the judge walk more.
MAX_ATTRIBUTES_BYTES = 64 * 1024

_KIND_FROM_PB = {
    pb.JUDGE_KIND_UNSPECIFIED: LLM,
    pb.JUDGE_KIND_LLM: LLM,
    pb.JUDGE_KIND_HEURISTIC: HEURISTIC,
    pb.JUDGE_KIND_REFERENCE: REFERENCE,
    pb.JUDGE_KIND_REWARD_MODEL: REWARD_MODEL,
    pb.JUDGE_KIND_EMBEDDING: EMBEDDING,
}
_KIND_TO_PB = {v: k for k, v in _KIND_FROM_PB.items() if k != pb.JUDGE_KIND_UNSPECIFIED}
_METHOD = {
    pb.AGGREGATION_METHOD_UNSPECIFIED: Method.WEIGHTED_MEAN,
    pb.AGGREGATION_METHOD_WEIGHTED_MEAN: Method.WEIGHTED_MEAN,
    pb.AGGREGATION_METHOD_WEIGHTED_SUM: Method.WEIGHTED_SUM,
    pb.AGGREGATION_METHOD_GEOMETRIC_MEAN: Method.GEOMETRIC_MEAN,
}
_SPAN_KIND = {
    spans_pb2.SPAN_KIND_PROMPT: "prompt",
    spans_pb2.SPAN_KIND_TOOL: "tool",
    spans_pb2.SPAN_KIND_REWARD: "reward",
    spans_pb2.SPAN_KIND_COORDINATION: "coordination",
    spans_pb2.SPAN_KIND_CONTENT: "content",
    spans_pb2.SPAN_KIND_REASONING: "reasoning",
}


def _kind(value: int) -> str:
    if value not in _KIND_FROM_PB:
        raise InvalidArgument(f"unknown judge kind {value}")
    return _KIND_FROM_PB[value]


def _method(value: int) -> Method:
    if value not in _METHOD:
        raise InvalidArgument(f"unknown aggregation method {value}")
    return _METHOD[value]


def _judgement(j: Judgement) -> pb.Judgement:
    return pb.Judgement(
        score=j.score,
        components=j.components,
        explanation=j.explanation,
        judge=_KIND_TO_PB[j.kind],
        fallback_used=j.fallback_used,
        cached=j.cached,
        fallback_reason=j.fallback_reason,
        judge_id=j.judge_id,
        rubric=j.rubric,
        rubric_version=j.rubric_version,
    )


def _compare(c: CompareResult) -> pb.CompareResponse:
    return pb.CompareResponse(
        prefer_a=c.prefer_a,
        orders_agree=c.orders_agree,
        judge=_KIND_TO_PB[c.kind],
        fallback_used=c.fallback_used,
        prefer_a_forward=c.prefer_a_forward,
        prefer_a_swapped=c.prefer_a_swapped,
        fallback_reason=c.fallback_reason,
        cached=c.cached,
        judge_id=c.judge_id,
    )


def rubric_message(r: rubrics.Rubric) -> pb.Rubric:
    msg = pb.Rubric(
        name=r.name,
        version=r.version,
        description=r.description,
        criteria=[pb.Criterion(name=c.name, description=c.description, weight=c.weight) for c in r.criteria],
        preset=r.preset,
    )
    if r.updated_at is not None:
        msg.updated_at.FromDatetime(r.updated_at)
    return msg


def rubric_from_message(m: pb.Rubric) -> rubrics.Rubric:
    return rubrics.validate(
        rubrics.Rubric(
            name=m.name,
            version=m.version,
            description=m.description,
            criteria=tuple(rubrics.Criterion(c.name, c.description, c.weight) for c in m.criteria),
        )
    )


def span_view(s: spans_pb2.Span, field: str = "span") -> SpanView:
    """What the trace rewards read from a span, refusing (naming ``field``) what is not a
    span: unknown enums, NUL or over-long names, non-finite numbers, negative token counts,
    attributes with NaN, NUL, too deep or too large."""
    check_enum(s.kind, spans_pb2.SpanKind, f"{field}.kind")
    check_enum(s.status, spans_pb2.SpanStatus, f"{field}.status")
    check_string(s.name, f"{field}.name", max_len=MAX_SPAN_NAME_CHARS)
    if s.HasField("reward"):
        check_number(s.reward, f"{field}.reward")
    check_number(s.reward_min, f"{field}.reward_min")
    check_number(s.reward_max, f"{field}.reward_max")
    check_number(s.input_tokens, f"{field}.input_tokens", min_value=0)
    check_number(s.output_tokens, f"{field}.output_tokens", min_value=0)
    return SpanView(
        kind=_SPAN_KIND.get(s.kind, "unknown"),
        name=s.name,
        ok=s.status != spans_pb2.SPAN_STATUS_ERROR,
        attributes=struct_to_dict(s.attributes, f"{field}.attributes", max_bytes=MAX_ATTRIBUTES_BYTES)
        if s.HasField("attributes")
        else {},
        tokens=int(s.input_tokens + s.output_tokens),
        reward=s.reward if s.HasField("reward") else None,
        reward_min=s.reward_min,
        reward_max=s.reward_max,
    )


class RewardJudgeServicer(pb_grpc.RewardJudgeServiceServicer):
    def __init__(
        self, judge: JudgeService, store: RubricStore, stats: StatsSink, limits: RequestLimits | None = None
    ) -> None:
        self._limits = limits or RequestLimits()
        self._judge = judge
        self._store = store
        self._stats = stats

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        j = await self._judge.score(
            prompt=request.prompt,
            response=request.response,
            rubric=request.rubric,
            rubric_version=request.rubric_version,
            reference=request.reference,
            judge=_kind(request.judge),
            human_score=request.human_score if request.HasField("human_score") else None,
        )
        return pb.ScoreResponse(judgement=_judgement(j))

    async def Rank(self, request: pb.RankRequest, context: grpc.aio.ServicerContext) -> pb.RankResponse:
        r = await self._judge.rank(
            prompt=request.prompt,
            responses=list(request.responses),
            rubric=request.rubric,
            rubric_version=request.rubric_version,
            judge=_kind(request.judge),
        )
        return pb.RankResponse(
            judgements=[_judgement(j) for j in r.judgements],
            order_agreement=r.order_agreement,
            fallback_used=r.fallback_used,
            cached=r.cached,
        )

    async def Compare(self, request: pb.CompareRequest, context: grpc.aio.ServicerContext) -> pb.CompareResponse:
        c = await self._judge.compare(
            prompt=request.prompt,
            response_a=request.response_a,
            response_b=request.response_b,
            rubric=request.rubric,
            rubric_version=request.rubric_version,
            reference=request.reference,
            judge=_kind(request.judge),
        )
        return _compare(c)

    async def Aggregate(self, request: pb.AggregateRequest, context: grpc.aio.ServicerContext) -> pb.AggregateResponse:
        if not request.candidates:
            raise InvalidArgument("Aggregate needs at least one candidate with signals")
        lim = self._limits
        if len(request.candidates) > lim.max_aggregate_candidates:
            raise InvalidArgument(
                f"AggregateRequest.candidates has {len(request.candidates):,}; at most "
                f"{lim.max_aggregate_candidates:,} (FLYWHEEL_REWARD_JUDGE_MAX_AGGREGATE_CANDIDATES)"
            )
        method = _method(request.method)
        results = []
        first_of: dict[str, int] = {}
        for i, cand in enumerate(request.candidates):
            field = f"AggregateRequest.candidates[{i}]"
            check_string(cand.id, f"{field}.id", max_len=MAX_ID_CHARS)
            # Results are matched to candidates by id: two with one id cannot be told apart.
            # Ids are optional (results keep the request's order), so only given ids must differ.
            if cand.id and first_of.setdefault(cand.id, i) != i:
                first = first_of[cand.id]
                raise Invalid(f"{field}.id", f"{cand.id!r} is also candidates[{first}].id; ids must be unique")
            if len(cand.signals) > lim.max_signals_per_candidate:
                raise InvalidArgument(
                    f"{field}.signals has {len(cand.signals):,}; at most "
                    f"{lim.max_signals_per_candidate} (FLYWHEEL_REWARD_JUDGE_MAX_SIGNALS_PER_CANDIDATE)"
                )
            for k, s in enumerate(cand.signals):
                check_string(s.name, f"{field}.signals[{k}].name", max_len=MAX_KEY_CHARS)
            signals = [
                Signal(
                    s.name,
                    s.value if s.HasField("value") else None,
                    s.min,
                    s.max if (s.max or s.min) else 1.0,  # an unset scale means [0, 1]
                    s.weight if s.weight else 1.0,
                    s.lower_is_better,
                )
                for s in cand.signals
            ]
            try:
                results.append(aggregate(signals, method))
            except InvalidArgument as exc:
                raise InvalidArgument(f"candidate {cand.id or i}: {exc}") from None
        ranks = pareto_ranks([r.components for r in results])
        return pb.AggregateResponse(
            results=[
                pb.AggregateResult(id=c.id, total=r.total, components=r.components, pareto_rank=k)
                for c, r, k in zip(request.candidates, results, ranks, strict=True)
            ]
        )

    async def TraceReward(
        self, request: pb.TraceRewardRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceRewardResponse:
        if not request.spans and not request.answer:
            raise InvalidArgument("TraceReward needs spans or an answer")
        if len(request.spans) > self._limits.max_trace_spans:
            raise InvalidArgument(
                f"TraceRewardRequest.spans has {len(request.spans):,}; at most "
                f"{self._limits.max_trace_spans:,} (FLYWHEEL_REWARD_JUDGE_MAX_TRACE_SPANS)"
            )
        check_text("TraceRewardRequest.answer", request.answer, max_chars=self._limits.max_text_chars, required=False)
        views = [span_view(s, f"TraceRewardRequest.spans[{i}]") for i, s in enumerate(request.spans)]
        agg, signals = trace_reward(views, request.answer, _method(request.method))
        return pb.TraceRewardResponse(
            total=agg.total,
            components=[
                pb.TraceRewardComponent(
                    name=s.name,
                    raw=s.value if s.value is not None else math.nan,
                    min=s.min,
                    max=s.max,
                    normalised=agg.components.get(s.name, math.nan),
                    weight=s.weight,
                )
                for s in signals
            ],
        )

    async def ListRubrics(
        self, request: pb.ListRubricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRubricsResponse:
        return pb.ListRubricsResponse(rubrics=[rubric_message(r) for r in await self._store.list()])

    async def GetRubric(self, request: pb.GetRubricRequest, context: grpc.aio.ServicerContext) -> pb.GetRubricResponse:
        if not request.name:
            raise InvalidArgument("rubric name is empty")
        r = await self._store.get(request.name, request.version)
        return pb.GetRubricResponse(rubric=rubric_message(r), yaml=r.to_yaml())

    async def PutRubric(self, request: pb.PutRubricRequest, context: grpc.aio.ServicerContext) -> pb.PutRubricResponse:
        if request.yaml and request.HasField("rubric"):
            raise InvalidArgument("send either rubric or yaml, not both")
        if request.yaml:
            r = rubrics.from_yaml(
                request.yaml,
                field="PutRubricRequest.yaml",
                max_chars=self._limits.rubric_yaml_max_chars,
                max_nodes=self._limits.rubric_yaml_max_nodes,
            )
        elif request.HasField("rubric"):
            r = rubric_from_message(request.rubric)
        else:
            raise InvalidArgument("PutRubric needs a rubric (message or YAML)")
        stored = await self._store.put(dataclasses.replace(r, preset=False))
        return pb.PutRubricResponse(rubric=rubric_message(stored))

    async def GetReliability(
        self, request: pb.GetReliabilityRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReliabilityResponse:
        check_string(request.judge_id, "GetReliabilityRequest.judge_id", max_len=MAX_ID_CHARS)
        figures = await self._stats.figures(request.judge_id)
        return pb.GetReliabilityResponse(
            judges=[
                pb.JudgeReliability(
                    judge_id=f.judge_id,
                    judgements=f.judgements,
                    fallbacks=f.fallbacks,
                    fallback_rate=f.fallback_rate,
                    swap_pairs=f.swap_pairs,
                    swap_agreement=f.swap_agreement,
                    human_labels=f.human_labels,
                    spearman=f.spearman,
                    kendall=f.kendall,
                )
                for f in figures
            ]
        )
