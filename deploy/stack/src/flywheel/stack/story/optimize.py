"""Stage 1 of the story: batch optimization of the support assistant's config, society on.

``optimize(ctx)`` starts the run (``world.run_config``: RLP proposals before each generation)
and, beside it, one SAO round of the society; it watches both (polling, so a service killed and
restarted by the kill drill mid-stage is read again, never counted twice), then fills
``ctx.record.optimize`` (see ``record.py``) and hands the best distinct configs to stage 2 in
``ctx.top_configs``.

``record.optimize["outputs"]`` holds, for each of ``ctx.top_configs`` (same order), the answers
the run's evaluations got on each test case (from the run's ``detailed_results.json``), so
stage 2 can replay them without calling the model again:
``[{"params": {...}, "candidate_ids": [...], "answers": {case_id: text}, "scores": {case_id: float}}]``.

A run that fails, or whose evaluations all failed, raises ``StageFailed``: the story does not
go on over a stage that did not happen."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import run_service_pb2 as run_pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as run_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.society.v1 import society_service_pb2 as soc_pb
from flywheel.api.society.v1 import society_service_pb2_grpc as soc_grpc
from flywheel.stack.story.context import StoryContext
from flywheel.stack.story.world import TINY, run_config

T = TypeVar("T")

BAR = "1/5 batch optimization"
POLL_S = 0.5
# A service the kill drill restarts is unreachable for seconds; reads are retried this long.
RETRY_S = 60.0
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
TERMINAL = {runs_pb2.RUN_STATE_SUCCEEDED, runs_pb2.RUN_STATE_FAILED, runs_pb2.RUN_STATE_CANCELLED}
SAO_DONE = ("succeeded", "failed")


class StageFailed(RuntimeError):
    """Stage 1 did not produce what the story needs (the message says what and why)."""


@dataclass(frozen=True)
class Limits:
    """How long stage 1 may take: the run, the SAO round, and the wait for the society's last
    RLP step to settle after the run ends."""

    run_s: float = 900.0
    sao_s: float = 900.0
    rlp_settle_s: float = 45.0


def sao_config(ctx: StoryContext) -> dict[str, Any]:
    """One short, seeded SAO round: ``sao_personas`` personas, short prompts and answers. Two
    calls in flight: the model server generates one request at a time, and the batch run's
    evaluations wait in the same queue."""
    tiny = ctx.served_model == TINY  # gibberish whatever its length: keep its calls short
    return {
        "n_personas": ctx.sizes.sao_personas,
        "seed": ctx.sizes.seed,
        "iterative_rounds": 1,
        "batch_size": 2,
        "temperature": 0.8,
        "min_response_length": 12,
        "max_persona_tokens": 8 if tiny else 16,
        "max_prompt_tokens": 12 if tiny else 24,
        "max_response_tokens": 16 if tiny else 32,
        "max_ranking_tokens": 8 if tiny else 32,
        "validation_fraction": 0.0,
        "llm_timeout_s": 150,
    }


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def _plain(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message) if message is not None else {}


async def _read(call: Callable[[], Awaitable[T]], what: str) -> T:
    """A read retried while its service is down (the kill drill restarts it on the same port)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRIED or time.monotonic() > deadline:
                raise StageFailed(f"stage 1: {what}: {exc.code().name}: {exc.details()}") from exc
        await asyncio.sleep(POLL_S)


async def optimize(ctx: StoryContext, limits: Limits = Limits()) -> None:
    """Stage 1: run the batch optimization and one SAO round at once; fill ``ctx.record.optimize``
    and ``ctx.top_configs``. Raises ``StageFailed`` when the run fails, all its evaluations
    fail, or either part outlasts ``limits``."""
    started = time.monotonic()
    async with (
        grpc.aio.insecure_channel(ctx.address("optimizer")) as opt_channel,
        grpc.aio.insecure_channel(ctx.address("society")) as soc_channel,
    ):
        runs = run_grpc.RunServiceStub(opt_channel)
        society = soc_grpc.SocietyServiceStub(soc_channel)
        run = (await runs.StartRun(run_pb.StartRunRequest(config=_struct(run_config(ctx))), timeout=30)).run
        dataset_id = f"{ctx.endpoint}-sao-{uuid.uuid4().hex[:8]}"
        sao = (
            await society.StartSaoRound(
                soc_pb.StartSaoRoundRequest(dataset_id=dataset_id, config=_struct(sao_config(ctx))), timeout=30
            )
        ).round
        ctx.progress.say(f"batch run {run.run_id} started; SAO round {sao.round_id} queued")
        final, sao_final, sao_seconds = await _watch(ctx, runs, society, run, sao.round_id, limits)
        run_seconds = time.monotonic() - started
        check_run(final)
        rlp = await _rlp_stats(society, final.run_id, limits.rlp_settle_s)
        listed = await _read(
            lambda: runs.ListRunCandidates(run_pb.ListRunCandidatesRequest(run_id=final.run_id), timeout=30),
            "ListRunCandidates",
        )
        detailed = await _detailed_results(runs, final.run_id)
        datasets = await _read(lambda: society.ListDatasets(soc_pb.ListDatasetsRequest(), timeout=30), "ListDatasets")

    ctx.top_configs, outputs = top_configs(detailed, ctx.sizes.arms)
    if not ctx.top_configs:
        raise StageFailed(f"stage 1: run {final.run_id} has no evaluated candidate to serve")
    best_config = json.loads(json.dumps(_plain(final.best_config)))
    ctx.record.optimize = {
        "run_id": final.run_id,
        "state": runs_pb2.RunState.Name(final.state).removeprefix("RUN_STATE_").lower(),
        "seconds": round(run_seconds, 1),
        "evaluations": final.evaluations_done,
        "evaluations_total": final.evaluations_total,
        "evaluations_failed": final.evaluations_failed,
        "best_score": final.best_score,
        "best_config": best_config,
        "curve": curve(listed.candidates, len(run_config(ctx)["evaluation"]["test_cases"]["inline"])),
        "rlp": rlp,
        "sao": sao_record(sao_final, dataset_id, datasets.datasets, sao_seconds),
        "top_configs": ctx.top_configs,
        "outputs": outputs,
    }
    sao_line = ctx.record.optimize["sao"]
    ctx.progress.say(
        f"best score {final.best_score:.3f} after {final.evaluations_done} evaluations"
        f" ({final.evaluations_failed} failed); RLP steps {rlp['steps']} ({rlp['steps_failed']} failed),"
        f" proposals {rlp['proposals']}; SAO {sao_line['state']}: {sao_line['pairs']} pairs"
        f" of {sao_line['attempted']} attempted"
    )


async def _watch(
    ctx: StoryContext,
    runs: run_grpc.RunServiceStub,
    society: soc_grpc.SocietyServiceStub,
    run: runs_pb2.Run,
    round_id: str,
    limits: Limits,
) -> tuple[runs_pb2.Run, soc_pb.SaoRound, float]:
    """Poll the run and the SAO round until both end; update the bar; call each hook once."""
    started = time.monotonic()
    run_deadline, sao_deadline = started + limits.run_s, started + limits.sao_s
    fired: set[str] = set()
    sao: soc_pb.SaoRound | None = None
    sao_seconds = 0.0
    with ctx.progress.bar(BAR, run.evaluations_total or None) as bar:
        run_id = run.run_id
        while True:
            run = (await _read(lambda: runs.GetRun(run_pb.GetRunRequest(run_id=run_id), timeout=10), "GetRun")).run
            if sao is None or sao.state not in SAO_DONE:
                sao = (
                    await _read(
                        lambda: society.GetSaoRound(soc_pb.GetSaoRoundRequest(round_id=round_id), timeout=10),
                        "GetSaoRound",
                    )
                ).round
                if sao.state in SAO_DONE:
                    sao_seconds = time.monotonic() - started
            run_done, sao_done = run.state in TERMINAL, sao.state in SAO_DONE
            note = f"gen {run.generation}/{run.generations_total}, best {run.best_score:.3f}; SAO {sao.state}"
            bar.update(completed=run.evaluations_done, total=run.evaluations_total or None, note=note)
            # Each hook once, when its work is in flight (or, if it ended before we looked, then).
            if "optimize.running" not in fired and (run.evaluations_done > 0 or run_done):
                fired.add("optimize.running")
                await ctx.hooks.reached("optimize.running", ctx)
            if "optimize.sao_running" not in fired and (sao.state == "running" or sao_done):
                fired.add("optimize.sao_running")
                await ctx.hooks.reached("optimize.sao_running", ctx)
            if run_done and sao_done:
                # Racing skips evaluations a candidate no longer needs: the bar ends at what ran.
                bar.update(completed=run.evaluations_done, total=max(run.evaluations_done, 1), note="done")
                return run, sao, sao_seconds
            now = time.monotonic()
            if not run_done and now > run_deadline:
                raise StageFailed(
                    f"stage 1: run {run.run_id} still {runs_pb2.RunState.Name(run.state)} after {limits.run_s:.0f} s"
                    f" ({run.evaluations_done} of {run.evaluations_total} evaluations)"
                )
            if not sao_done and now > sao_deadline:
                raise StageFailed(f"stage 1: SAO round {round_id} still {sao.state} after {limits.sao_s:.0f} s")
            await asyncio.sleep(POLL_S)


def check_run(run: runs_pb2.Run) -> None:
    """Raise ``StageFailed`` unless the run succeeded with at least one evaluation that did not fail."""
    if run.state != runs_pb2.RUN_STATE_SUCCEEDED:
        raise StageFailed(
            f"stage 1: run {run.run_id} ended {runs_pb2.RunState.Name(run.state)}: {run.error or 'no error given'}"
        )
    if run.evaluations_done == 0 or run.evaluations_failed >= run.evaluations_done:
        errors = "; ".join(f"{e.message} (x{e.count})" for e in run.top_errors) or "no error recorded"
        raise StageFailed(
            f"stage 1: run {run.run_id}: {run.evaluations_failed} of {run.evaluations_done}"
            f" evaluations failed: {errors}"
        )


async def _rlp_stats(society: soc_grpc.SocietyServiceStub, run_id: str, settle_s: float) -> dict[str, Any]:
    """The society's RLP figures for the run, once they settle: at least one step recorded,
    every proposal resolved, and the same figures twice in a row (or ``settle_s`` passed)."""
    deadline = time.monotonic() + settle_s
    last: dict[str, Any] | None = None
    while True:
        got = (await _read(lambda: society.GetStats(soc_pb.GetStatsRequest(run_id=run_id), timeout=10), "GetStats")).rlp
        now = {
            "steps": got.steps,
            "steps_failed": got.steps_failed,
            "failures": dict(got.failures),
            "proposals": got.proposals,
            "proposals_resolved": got.proposals_resolved,
            "hit_rate": got.hit_rate if math.isfinite(got.hit_rate) else None,
            "mean_reward": got.mean_reward if math.isfinite(got.mean_reward) else None,
            "reward_definitions": dict(got.reward_definitions),
            "thoughts_rewarded": got.thoughts_rewarded,
            "policy_model": got.policy_model,
        }
        settled = now["steps"] >= 1 and now["proposals_resolved"] >= now["proposals"] and now == last
        if settled or time.monotonic() > deadline:
            return now
        last = now
        await asyncio.sleep(1.0)


async def _detailed_results(runs: run_grpc.RunServiceStub, run_id: str) -> dict[str, Any]:
    request = run_pb.GetRunArtifactRequest(run_id=run_id, name="detailed_results.json")
    got = await _read(lambda: runs.GetRunArtifact(request, timeout=30), "GetRunArtifact detailed_results.json")
    return json.loads(got.content)


def curve(candidates: Any, test_cases: int) -> list[dict[str, Any]]:
    """The run's candidates in evaluation order (generation, then candidate id): ``evaluation``
    is the evaluations stored up to and including this candidate, ``score`` its mean, ``best``
    the best mean so far among candidates scored on every case (racing drops some after a few
    lucky cases, which would draw the curve above the result the run reports); ``None`` until
    one is."""
    ordered = sorted(candidates, key=lambda c: (c.generation, c.candidate_id))
    out, done, best = [], 0, -math.inf
    for c in ordered:
        if c.cases_evaluated == 0:
            continue  # raced out before any case, or never reached
        done += c.cases_evaluated
        if c.cases_evaluated >= test_cases:
            best = max(best, c.mean_score)
        out.append(
            {
                "evaluation": done,
                "score": c.mean_score,
                "best": best if math.isfinite(best) else None,
                "origin": c.origin or "search",
                "generation": c.generation,
                "candidate_id": c.candidate_id,
                "cases": c.cases_evaluated,
                "cases_failed": c.cases_failed,
            }
        )
    return out


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def top_configs(detailed: dict[str, Any], arms: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The best ``arms`` distinct configs in the run's own ranking (``detailed_results.json``'s
    candidates: scored on every case first, then by mean score) and, for each, the answers its
    evaluations got per test case (the first successful one when a config was evaluated twice)."""
    tops: list[dict[str, Any]] = []
    ids: dict[str, list[str]] = {}
    for c in detailed.get("candidates", []):
        key = _key(c["config"])
        if key in ids:
            ids[key].append(c["candidate_id"])
            continue
        if len(tops) < arms:
            ids[key] = [c["candidate_id"]]
            tops.append(
                {
                    "params": c["config"],
                    "score": c["mean_score"],
                    "cases": c["cases"],
                    "errors": c["errors"],
                    "candidate_id": c["candidate_id"],
                    "origin": c["origin"],
                }
            )
    outputs = []
    for top in tops:
        mine = set(ids[_key(top["params"])])
        answers: dict[str, str] = {}
        scores: dict[str, float] = {}
        for e in detailed.get("evaluations", []):
            if e["candidate_id"] in mine and not e.get("error") and e["test_case_id"] not in answers:
                answers[e["test_case_id"]] = e.get("output", "")
                scores[e["test_case_id"]] = e["score"]
        outputs.append({"params": top["params"], "candidate_ids": sorted(mine), "answers": answers, "scores": scores})
    return tops, outputs


def sao_record(sao: soc_pb.SaoRound, dataset_id: str, datasets: Any, seconds: float) -> dict[str, Any]:
    """The SAO round's part of the record: its state, counts (``attempted == pairs_kept +
    sum(dropped)`` over its rounds) and, when it kept pairs, its registered dataset."""
    rounds = [_plain(r) for r in sao.rounds]
    dropped: dict[str, int] = {}
    for r in rounds:
        for reason, n in (r.get("dropped") or {}).items():
            dropped[reason] = dropped.get(reason, 0) + int(n)
    info = next((d for d in datasets if d.dataset_id == dataset_id), None)
    return {
        "round_id": sao.round_id,
        "state": sao.state,
        "error": sao.error,
        "seconds": round(seconds, 1),
        "dataset_id": info.dataset_id if info else None,
        "manifest_uri": info.manifest_uri if info else None,
        "pairs": (info.train_rows + info.validation_rows) if info else 0,
        "train_rows": info.train_rows if info else 0,
        "validation_rows": info.validation_rows if info else 0,
        "kept": sum(int(r.get("kept", 0)) for r in rounds),
        "attempted": sum(int(r.get("attempted", 0)) for r in rounds),
        "judged": sum(int(r.get("judged", 0)) for r in rounds),
        "dropped": dropped,
    }
