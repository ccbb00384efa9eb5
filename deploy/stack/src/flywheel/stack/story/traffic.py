"""Stage 2: the best configs of stage 1 become the arms of the product's endpoint, and
simulated product traffic goes through the SDK: Select → answer → trace (with the decision
id) → feedback over NATS.

The hidden ground truth: a user is satisfied with probability ``true_rate(answer, expected)``
(the answer's token F1 against the case's expected answer, the loop's shared text metric,
mapped to [FLOOR, FLOOR + SPAN]); the bandit only ever sees the 0/1 feedback. Answers come
from stage 1's recorded outputs when it kept them, otherwise from the model server, cached
per (case, arm) so the stage stays fast."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import grpc
import litellm
from google.protobuf import json_format

from flywheel.api.common.v1.common_pb2 import PageRequest
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.core.text_metrics import token_f1, words
from flywheel.sdk import FlywheelClient
from flywheel.sdk.decision import Decision
from flywheel.sdk.tracing import Tracer, prompt, trace
from flywheel.stack.story.context import StoryContext
from flywheel.stack.story.verdict import verdict, verdict_text
from flywheel.stack.story.world import CASES_FILE

FLOOR, SPAN = 0.1, 0.8  # true satisfaction rates lie in [FLOOR, FLOOR + SPAN]
BRIEF = 12  # words a user reads without minding
CANARY_RULE = ep_pb.CanaryRule(min_pulls=20, promote_probability=0.9, retire_probability=0.1)
TIMELINE_POINTS = 20
# Params of a config that are the model call's (the rest, e.g. the system prompt, shape the messages).
T = TypeVar("T")
CALL_PARAMS = {"temperature": float, "top_p": float, "max_tokens": int}
DEFAULT_MAX_TOKENS = 32
VARIANTS = 3  # different answers an arm gives one question (each generated once, then reused)
RETRY_TEMPERATURE = 0.7  # a regenerated answer is sampled


def true_rate(answer: str, expected: str) -> float:
    """The hidden probability that a user is satisfied with ``answer`` (never shown to the
    bandit): mostly whether it says what the expected answer says (token F1), a little
    whether it is short (users skim: full marks up to BRIEF words)."""
    n = max(len(words(answer)), 1)
    brevity = min(1.0, BRIEF / n)
    return FLOOR + SPAN * (0.75 * token_f1(answer, expected) + 0.25 * brevity)


def story_cases(ctx: StoryContext) -> list[dict[str, Any]]:
    """What the product's users ask: the first ``sizes.traffic_questions`` shipped support cases
    (stage 1 tuned on the first ``sizes.test_cases``; users also ask others, whose answers the
    model server writes)."""
    return json.loads(CASES_FILE.read_text())["test_cases"][: ctx.sizes.traffic_questions]


def arm_id(rank: int) -> str:
    return f"config-{rank}"


def arm_params(ctx: StoryContext, params: dict[str, Any]) -> dict[str, Any]:
    """A config's params as an arm's: the model server's model (LiteLLM's OpenAI route)
    and URL added, so a canary version inherits them with its own model name."""
    return {**params, "model": f"openai/{ctx.served_model}", "api_base": ctx.model.url}


def endpoint_request(ctx: StoryContext) -> admin_pb.CreateEndpointRequest:
    if not ctx.top_configs:
        raise ValueError("top_configs: stage 1 handed no configs to serve as arms")
    arms = []
    for rank, config in enumerate(ctx.top_configs[: ctx.sizes.arms], start=1):
        arm = ep_pb.Arm(arm_id=arm_id(rank), status=ep_pb.ARM_STATUS_ACTIVE)
        arm.params.update(arm_params(ctx, dict(config["params"])))
        arms.append(arm)
    policy = ep_pb.PolicySpec(kind=ep_pb.POLICY_KIND_THOMPSON_BETA, canary=CANARY_RULE)
    return admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name=ctx.endpoint, arms=arms, policy=policy))


def recorded_outputs(ctx: StoryContext) -> int:
    """Stage 1's answers of the top configs on each case (``record.optimize["outputs"][i]
    ["answers"]``, ``i`` the config's rank - 1) as cached answers of their arms; returns how
    many it took."""
    listed = (ctx.record.optimize or {}).get("outputs") or []
    taken = 0
    for i, outputs in enumerate(listed[: ctx.sizes.arms]):
        for case_id, text in (outputs.get("answers") or {}).items():
            if isinstance(text, str) and text.strip() and (case_id, arm_id(i + 1)) not in ctx.answers:
                ctx.answers[(case_id, arm_id(i + 1))] = text
                taken += 1
    return taken


def messages(params: dict[str, Any], question: str) -> list[dict[str, str]]:
    system = params.get("system_prompt")
    said = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    return [*said, {"role": "user", "content": question}]


async def generate(ctx: StoryContext, params: dict[str, Any], question: str) -> str:
    """One answer from the model server, with the arm's model (a canary's adapter by its name)."""
    call = {k: cast(params[k]) for k, cast in CALL_PARAMS.items() if isinstance(params.get(k), (int, float))}
    call.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    reply = await litellm.acompletion(
        model=params["model"],
        api_base=ctx.model.url,
        api_key=ctx.model.api_key,
        messages=messages(params, question),
        timeout=120,
        **call,
    )
    return str(reply.choices[0].message.content or "")


class Product:
    """The simulated product: its SDK client and tracer, the cases its users ask, and the
    hidden truth that decides whether a user is satisfied."""

    def __init__(
        self, ctx: StoryContext, fw: FlywheelClient, tracer: Tracer, *, stream: int = 0, variants: int = VARIANTS
    ) -> None:
        self.ctx, self.fw, self.tracer = ctx, fw, tracer
        # Different answers an arm gives one question: its own (the config's, greedy or not)
        # and, as users asking again get a regenerated answer, variants - 1 sampled ones.
        self.n_variants = variants
        self.cases = story_cases(ctx)
        # A reproducible simulation; ``stream`` gives each stage its own sequence of users.
        self.rng = random.Random(ctx.sizes.seed * 1000 + stream)  # noqa: S311
        self.stream = stream
        self.served = 0  # decisions made by this product
        self.feedback_sent = 0
        self.trace_ids: list[str] = []
        self.generated = 0  # answers the model server wrote for this product
        self.variants: dict[tuple[str, str], list[str]] = {}  # (case id, arm id) -> its answers so far

    @classmethod
    async def open(
        cls, ctx: StoryContext, exits: AsyncExitStack, *, stream: int = 0, variants: int = VARIANTS
    ) -> Product:
        env = ctx.stack.servers.env(nats_role="product")  # the product's NATS user: feedback and traces only
        nats = {"nats_url": env["FLYWHEEL_NATS_URL"], "nats_user": env["FLYWHEEL_NATS_USER"]}
        nats["nats_password"] = env["FLYWHEEL_NATS_PASSWORD"]
        fw = await exits.enter_async_context(FlywheelClient(target=ctx.address("optimizer"), source="story", **nats))
        tracer = Tracer(agent=ctx.endpoint, source="story", **nats)
        exits.callback(tracer.close)
        return cls(ctx, fw, tracer, stream=stream, variants=variants)

    async def answer(self, case: dict[str, Any], decision: Decision) -> str:
        """The arm's answer: one of up to ``n_variants`` answers per (case, arm), each
        written by the model server once (the first may be stage 1's, replayed)."""
        key = (case["id"], decision.arm_id)
        params = dict(decision.params)
        known = self.variants.setdefault(key, [self.ctx.answers[key]] if key in self.ctx.answers else [])
        k = self.rng.randrange(self.n_variants)
        if k >= len(known):
            again = {**params, "temperature": max(float(params.get("temperature") or 0), RETRY_TEMPERATURE)}
            known.append(await generate(self.ctx, params if not known else again, case["input"]))
            self.generated += 1
            k = len(known) - 1
        self.ctx.answers.setdefault(key, known[0])
        return known[k]

    async def serve(self) -> tuple[Decision, float]:
        """One request: Select, answer (traced with the decision id), the user's feedback."""
        i = self.served
        case = self.rng.choice(self.cases)
        decision = await self.fw.select(self.ctx.endpoint, user_id=f"user-{self.stream}-{i % 40}")
        answer = await self.answer(case, decision)
        with trace("answer a ticket", input=case["input"], decision_id=decision.decision_id, tracer=self.tracer) as run:
            with prompt("answer", input=case["input"], model=str(decision.params["model"]), tracer=self.tracer) as p:
                p.output = answer
            self.trace_ids.append(run.trace_id)
        reward = 1.0 if self.rng.random() < true_rate(answer, case["expected"]) else 0.0
        self.served += 1
        # Queued, acknowledged in the background (``flush`` waits): a product does not wait on it.
        self.fw.feedback_nowait(decision, reward=reward, event_id=f"story-{decision.decision_id}")
        self.feedback_sent += 1
        return decision, reward

    async def flush(self) -> None:
        stats = await self.fw.flush_feedback()
        if stats.failed:
            raise RuntimeError(f"feedback: {stats.failed} events not acknowledged by JetStream: {stats}")
        await asyncio.to_thread(self.tracer.flush)

    def arm_true_rate(self, arm: str) -> float | None:
        """The hidden mean satisfaction of an arm's answers (each case's answers averaged, then
        the cases it answered; None: none)."""
        rates = []
        for c in self.cases:
            known = self.variants.get((c["id"], arm)) or []
            if known:
                rates.append(sum(true_rate(a, c["expected"]) for a in known) / len(known))
        return sum(rates) / len(rates) if rates else None


async def retrying(call: Callable[[], Awaitable[T]], *, timeout_s: float = 60.0) -> T:
    """``call()`` again while its service is UNAVAILABLE (a restarted service comes back on
    the same address), up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def get_endpoint(ctx: StoryContext, channel: grpc.aio.Channel) -> ep_pb.Endpoint:
    admin = admin_grpc.EndpointAdminServiceStub(channel)
    return (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name=ctx.endpoint))).endpoint


def posterior(endpoint: ep_pb.Endpoint) -> dict[str, dict[str, float]]:
    return {s.arm_id: {"alpha": s.alpha, "beta": s.beta, "mean": s.mean} for s in endpoint.stats}


def applied(endpoint: ep_pb.Endpoint) -> int:
    return sum(s.pulls for s in endpoint.stats)


async def wait_until(
    what: str, probe: Callable[[], Awaitable[int]], want: int, *, timeout_s: float, exact: bool = True
) -> int:
    """Poll ``probe`` until it returns ``want``; a clear error with the last figure otherwise
    (and at once when it goes past ``want`` with ``exact``: something was counted twice)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await probe()
        if got == want:
            return got
        if exact and got > want:
            raise RuntimeError(f"{what}: {got}, more than the {want} expected (counted twice?)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {got} of {want} after {timeout_s:.0f} s")
        await asyncio.sleep(0.25)


async def rewarded_traces(ctx: StoryContext, channel: grpc.aio.Channel) -> int:
    """Traces of the story's agent that carry a reward (their decision's feedback joined)."""
    store = ts_grpc.TraceStoreServiceStub(channel)
    count, token = 0, ""
    while True:
        found = await store.QueryTraces(
            ts_pb.QueryTracesRequest(agent=ctx.endpoint, page=PageRequest(page_size=500, page_token=token))
        )
        count += sum(1 for t in found.traces if t.HasField("reward"))
        token = found.next_page_token
        if not token:
            return count


async def settle(
    ctx: StoryContext, product: Product, opt: grpc.aio.Channel, store: grpc.aio.Channel, *, already: int = 0
) -> tuple[int, int]:
    """Wait until every decision's feedback is applied once and every trace is rewarded
    (``already``: decisions of earlier stages); returns (feedback applied, traces rewarded),
    every stage's."""
    await product.flush()
    want = product.served + already

    async def feedback_applied() -> int:
        return applied(await retrying(lambda: get_endpoint(ctx, opt)))

    async def traces() -> int:
        return await retrying(lambda: rewarded_traces(ctx, store))

    got = await wait_until("feedback applied", feedback_applied, want, timeout_s=90)
    rewarded = await wait_until("traces rewarded", traces, want, timeout_s=90)
    return got, rewarded


async def traffic(ctx: StoryContext) -> None:
    """Stage 2: create the endpoint from ``ctx.top_configs`` and serve
    ``sizes.traffic_decisions`` product requests; fills ``ctx.record.traffic``."""
    began = time.monotonic()
    n = ctx.sizes.traffic_decisions
    async with AsyncExitStack() as exits:
        opt = await exits.enter_async_context(grpc.aio.insecure_channel(ctx.address("optimizer")))
        store = await exits.enter_async_context(grpc.aio.insecure_channel(ctx.address("trace_store")))
        await admin_grpc.EndpointAdminServiceStub(opt).CreateEndpoint(endpoint_request(ctx))
        replayed = recorded_outputs(ctx)
        product = await Product.open(ctx, exits, variants=ctx.sizes.answer_variants)
        every = max(1, n // TIMELINE_POINTS)
        timeline: list[dict[str, Any]] = []
        window: Counter[str] = Counter()
        with ctx.progress.bar("product traffic (Select, answer, trace, feedback)", n) as bar:
            for i in range(1, n + 1):
                decision, _ = await product.serve()
                window[decision.arm_id] += 1
                if i % every == 0 or i == n:
                    shares = {arm: count / sum(window.values()) for arm, count in sorted(window.items())}
                    timeline.append(
                        {
                            "decision": i,
                            "shares": shares,
                            "posterior": posterior(await retrying(lambda: get_endpoint(ctx, opt))),
                        }
                    )
                    window.clear()
                    bar.update(completed=i, note=" ".join(f"{a} {s:.0%}" for a, s in shares.items()))
                if i == n // 2:
                    await ctx.hooks.reached("traffic.halfway", ctx)
        # What follows waits on the bus (a killed trace store's unacked events come back after
        # its consumers' ack wait, 8 s in the story, run.TRACE_STORE_ENV): said, so a slow
        # telling shows where its time went.
        ctx.progress.say(f"traffic: {product.served} decisions served; waiting for feedback and traces to land")
        feedback_applied, traces = await settle(ctx, product, opt, store)
        endpoint = await retrying(lambda: get_endpoint(ctx, opt))
    batch = {arm_id(r): c.get("score") for r, c in enumerate(ctx.top_configs[: ctx.sizes.arms], start=1)}
    arms = [
        {
            "arm_id": a.arm_id,
            "params": json_format.MessageToDict(a.params),
            "true_rate": product.arm_true_rate(a.arm_id),
            "batch_score": batch.get(a.arm_id),
        }
        for a in endpoint.arms
    ]
    ctx.record.traffic = {
        "endpoint": ctx.endpoint,
        "seconds": round(time.monotonic() - began, 2),
        "decisions": product.served,
        "feedback_sent": product.feedback_sent,
        "feedback_applied": feedback_applied,
        "traces": traces,
        "trace_ids": list(product.trace_ids),
        "arms": arms,
        "timeline": timeline,
        "incumbent": endpoint.incumbent_arm_id,
        "verdict": verdict(arms, posterior(endpoint)),
        "answers_replayed": replayed,
        "answers_generated": product.generated,
    }
    ctx.progress.say(
        f"traffic: {product.served} decisions, feedback applied {feedback_applied} times, {traces} traces rewarded; "
        f"incumbent {endpoint.incumbent_arm_id or '(none yet)'}; "
        f"{verdict_text(ctx.record.traffic['verdict'], product.served)}"
    )
