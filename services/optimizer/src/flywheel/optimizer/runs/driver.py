"""The run driver: moves every running batch run forward, one step per tick.

A step is one transaction on the run's row, taken ``FOR UPDATE SKIP LOCKED`` so that one
replica at a time steps a run (the others skip it):

1. restore the search from ``runs.search_state`` (or build it on the first step);
2. record the results stored since the last step (``run_evaluations.seq`` > last seen), and
   the configs injected by outside proposers;
3. ask the search for more work, up to twice ``execution.parallel_workers`` in flight, and
   insert a ``run_requests`` row per request;
4. save the search state, generation, best so far; commit;
5. publish the new requests (message id = request id), and progress when it moved.

Crash safety: everything the search knows is committed before a request is published, and
a result is folded in only from its committed row. A driver that takes over a run (after a
restart, or from a dead replica) publishes every pending request again: JetStream drops
the ones it still remembers, the evaluator answers the rest, and a second answer to the same
request inserts nothing. So no evaluation is lost and none is counted twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import events_pb2, runs_pb2
from flywheel.api.subjects import Catalogue
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import get_logger
from flywheel.core.objects import ObjectStore
from flywheel.optimizer.models import RunCandidateRow, RunEvaluationRow, RunRow
from flywheel.optimizer.runconfig import RunConfig, parse_run_config
from flywheel.optimizer.runs import report
from flywheel.optimizer.runs.requests import RequestTemplate, request_id, struct_of
from flywheel.optimizer.search import Search

log = get_logger(__name__)

RUNNING, SUCCEEDED, FAILED, CANCELLED = "running", "succeeded", "failed", "cancelled"
ARTIFACTS = ("best_config.json", "detailed_results.json", "report.md", "report.html")
CONTENT_TYPES = {".json": "application/json", ".md": "text/markdown", ".html": "text/html"}
BUCKET = "runs"

_INSERT_CANDIDATE = text(
    "INSERT INTO run_candidates (run_id, candidate_id, generation, config, origin)"
    " VALUES (:run_id, :candidate_id, :generation, CAST(:config AS json), :origin) ON CONFLICT DO NOTHING"
)
_INSERT_REQUEST = text(
    "INSERT INTO run_requests (request_id, run_id, candidate_id, test_case_id)"
    " VALUES (:request_id, :run_id, :candidate_id, :test_case_id) ON CONFLICT DO NOTHING"
)
_TAKE_INJECTIONS = text(
    "UPDATE run_injections SET applied = true WHERE run_id = :run_id AND NOT applied RETURNING configs, origin"
)


class RunDriver:
    """Steps every running run; one per process, any number of replicas."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Publisher,
        catalogue: Catalogue,
        objects: ObjectStore,
        *,
        tick_s: float = 0.5,
    ) -> None:
        self._sessions = sessions
        self._publisher = publisher
        self._catalogue = catalogue
        self._objects = objects
        self._tick_s = tick_s
        self._templates: dict[str, RequestTemplate] = {}
        # Parsed configs and the search as this process last committed it, with the state's
        # version: rebuilding them from the row every tick cost ~1 s of event-loop time per
        # tick at 100,000 evaluations. Another replica's step bumps the version, so a stale
        # copy is never used.
        self._configs: dict[str, RunConfig] = {}
        self._searches: dict[str, tuple[int, Search]] = {}
        # Runs this process has stepped: a run it takes over has its pending requests re-sent.
        self._owned: set[str] = set()
        # Rate-limited runs: (tokens, when counted), see _paced.
        self._buckets: dict[str, tuple[float, float]] = {}

    async def run(self) -> None:
        """Step forever (a background task of the service)."""
        while True:
            try:
                await self.step_all()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL or NATS away: try again next tick
                log.warning("run step failed", error=repr(exc))
            await asyncio.sleep(self._tick_s)

    async def step_all(self) -> None:
        async with self._sessions() as session:
            ids = list((await session.scalars(select(RunRow.run_id).where(RunRow.state == RUNNING))).all())
        for gone in set(self._searches) - set(ids):  # cancelled, or finished by another replica
            self._searches.pop(gone, None)
            self._configs.pop(gone, None)
        for run_id in ids:
            try:
                await self.step(run_id)
            except Exception as exc:
                log.exception("run step failed", run_id=run_id, error=repr(exc))
                await self._fail(run_id, f"{type(exc).__name__}: {exc}")

    async def step(self, run_id: str) -> None:
        """One step of one run (no-op when another replica holds it or it is not running)."""
        requests = []
        finished = False
        async with self._sessions() as session, session.begin():
            row = (
                await session.execute(
                    select(RunRow)
                    .where(RunRow.run_id == run_id, RunRow.state == RUNNING)
                    .with_for_update(skip_locked=True)
                )
            ).scalar_one_or_none()
            if row is None:
                return
            config = self._configs.get(run_id) or self._configs.setdefault(run_id, parse_run_config(row.config))
            template = self._template(run_id, config)
            saved = row.search_state or {}
            version = int(saved.get("version", 0))
            # Popped: a step that fails half-way leaves no copy ahead of the committed state.
            cached = self._searches.pop(run_id, None)
            if cached is not None and cached[0] == version and "search" in saved:
                search = cached[1]
            elif "search" in saved:
                search = Search.from_state(saved["search"])
            else:
                search = Search(
                    config.search_space.to_space(),
                    list(template.cases),
                    config.optimization.search_settings(),
                    prior=await self._prior(session, row),
                )
            changed = "search" not in saved
            last_seq = int(saved.get("last_seq", 0))
            failed, stored = int(saved.get("failed", 0)), int(saved.get("stored", 0))
            fatal = ""
            before = (search.generation, search.evaluations)
            for r in await session.execute(
                select(
                    RunEvaluationRow.candidate_id,
                    RunEvaluationRow.test_case_id,
                    RunEvaluationRow.score,
                    RunEvaluationRow.seq,
                    RunEvaluationRow.error,
                )
                .where(RunEvaluationRow.run_id == run_id, RunEvaluationRow.seq > last_seq)
                .order_by(RunEvaluationRow.seq)
            ):
                if r.candidate_id in search.candidates:
                    search.record(r.candidate_id, r.test_case_id, r.score)
                last_seq = r.seq
                stored += 1
                failed += bool(r.error)
                fatal = fatal or (r.error if r.error and _config_error(r.error) else "")
                changed = True
            execution = config.optimization.execution
            # Every evaluation so far failed (a dead URL, a missing key): stop now, not after the
            # budget; one that no candidate can pass (a key not set on the evaluator) stops it at once
            doomed = bool(fatal) or failed == stored >= max(10, 2 * execution.parallel_workers)
            if not search.done:
                for injected in await session.execute(_TAKE_INJECTIONS, {"run_id": run_id}):
                    search.inject(list(injected.configs), origin=injected.origin)
                    changed = True
            if run_id not in self._owned:
                requests += [template.build(cid, search.candidates[cid].config, case) for cid, case in search.pending()]
                self._owned.add(run_id)
            limit = 2 * execution.parallel_workers - len(search.pending())
            limit = self._paced(run_id, config, limit)
            new = search.next_evaluations(limit) if not doomed else []
            if new:
                self._spend(run_id, len(new))
            if new:
                changed = True
                await session.execute(
                    _INSERT_CANDIDATE,
                    [
                        {
                            "run_id": run_id,
                            "candidate_id": cid,
                            "generation": search.candidates[cid].generation,
                            "config": _json(cfg),
                            "origin": search.candidates[cid].origin,
                        }
                        for cid, cfg in {cid: cfg for cid, cfg, _ in new}.items()
                    ],
                )
                await session.execute(
                    _INSERT_REQUEST,
                    [
                        {
                            "request_id": request_id(run_id, cid, case),
                            "run_id": run_id,
                            "candidate_id": cid,
                            "test_case_id": case,
                        }
                        for cid, _, case in new
                    ],
                )
                requests += [template.build(cid, cfg, case) for cid, cfg, case in new]
            changed = changed or search.done or (search.generation, search.evaluations) != before
            if changed:  # an idle tick writes nothing (the state is MBs for a large run)
                version += 1
                best = search.best()
                row.search_state = {
                    "search": search.to_state(),
                    "last_seq": last_seq,
                    "best": best,
                    "version": version,
                    "failed": failed,
                    "stored": stored,
                }
                row.generation = search.generation
                row.evaluations_done = search.evaluations
                if best is not None:
                    row.best_score = best["mean_score"]
                    row.best_config = best["config"]
                row.updated_at = func.now()
            finished = search.done or doomed
            if finished:
                row.stopped_because = (
                    "the evaluator cannot run this config"
                    if fatal
                    else "every evaluation failed"
                    if doomed and not search.done
                    else search.done_reason
                )
            moved = (search.generation, search.evaluations) != before
            progress = progress_message(row)
        if not finished:
            self._searches[run_id] = (version, search)
        if requests:
            await self._publisher.publish_many(
                [(self._catalogue.evaluation_request(run_id), r, r.request_id) for r in requests]
            )
        if fatal:
            await self.finish(run_id, state=FAILED, error=f"the evaluator cannot run this config: {fatal}")
        elif finished:
            await self.finish(run_id)
        elif moved:
            await self._publish_progress(progress)

    async def finish(self, run_id: str, *, state: str = SUCCEEDED, error: str = "") -> None:
        """Write the four result files and close the run (safe to repeat after a crash)."""
        async with self._sessions() as session:
            row = await session.get(RunRow, run_id)
            if row is None:
                return
            results = await _results(session, row, state=state)
            if state == SUCCEEDED:
                state, error = _judge_outcome(results, row.config) or (state, error)
                results = dataclasses.replace(results, state=state, error=error)
            else:
                results = dataclasses.replace(results, error=error)
        files = report.render(results)
        await self._objects.ensure_bucket(BUCKET)
        artifacts = {}
        for name in ARTIFACTS:
            artifacts[name] = await self._objects.put_bytes(
                BUCKET, f"{run_id}/{name}", files[name], content_type=content_type(name)
            )
        async with self._sessions() as session, session.begin():
            row = await session.get(RunRow, run_id, with_for_update=True)
            if row is None:
                return
            row.artifacts = artifacts
            if row.state == RUNNING:
                row.state = state
                row.error = error
            row.updated_at = func.now()
            progress = progress_message(row)
        self._templates.pop(run_id, None)
        self._configs.pop(run_id, None)
        self._searches.pop(run_id, None)
        self._owned.discard(run_id)
        self._buckets.pop(run_id, None)
        log.info("run finished", run_id=run_id, state=progress.state, best_score=progress.best_score)
        await self._publish_progress(progress)

    async def _fail(self, run_id: str, error: str) -> None:
        try:
            await self.finish(run_id, state=FAILED, error=error)
        except Exception as exc:  # noqa: BLE001 - at least mark it failed
            log.warning("writing a failed run's results failed", run_id=run_id, error=repr(exc))
            async with self._sessions() as session, session.begin():
                await session.execute(
                    update(RunRow)
                    .where(RunRow.run_id == run_id, RunRow.state == RUNNING)
                    .values(state=FAILED, error=error)
                )

    def _paced(self, run_id: str, config: RunConfig, limit: int) -> int:
        """How many new requests the run's rate limit allows now (a token bucket per run:
        one token per ``request_interval_s``, at most ``burst_limit`` saved up)."""
        interval = config.request_interval_s()
        if interval <= 0 or limit <= 0:
            return limit
        burst = config.rate_limiting.burst_limit if config.rate_limiting else 1
        now = time.monotonic()
        tokens, last = self._buckets.get(run_id, (float(burst), now))
        tokens = min(float(burst), tokens + (now - last) / interval)
        self._buckets[run_id] = (tokens, now)
        return min(limit, int(tokens))

    def _spend(self, run_id: str, n: int) -> None:
        if run_id in self._buckets:
            tokens, last = self._buckets[run_id]
            self._buckets[run_id] = (tokens - n, last)

    def _template(self, run_id: str, config: RunConfig) -> RequestTemplate:
        found = self._templates.get(run_id)
        if found is None:
            found = self._templates[run_id] = RequestTemplate.of(run_id, config)
        return found

    async def _prior(self, session: AsyncSession, row: RunRow) -> list[dict[str, Any]]:
        """Warm start: fully evaluated candidates of earlier finished runs on the same space."""
        config = parse_run_config(row.config)
        warm = config.optimization.warm_start
        if not warm.enabled or warm.max_runs == 0:
            return []
        fingerprint = config.search_space.to_space().fingerprint()
        earlier = (
            await session.scalars(
                select(RunRow)
                .where(RunRow.state == SUCCEEDED, RunRow.run_id != row.run_id)
                .order_by(RunRow.created_at.desc())
                .limit(50)
            )
        ).all()
        same = [r for r in earlier if _fingerprint(r.config) == fingerprint][: warm.max_runs]
        prior = []
        for r in same:
            for c in (r.search_state or {}).get("search", {}).get("candidates", []):
                scores = c.get("scores") or {}
                if scores:
                    prior.append({"config": c["config"], "score": sum(scores.values()) / len(scores)})
        return prior

    async def _publish_progress(self, progress: runs_pb2.RunProgress) -> None:
        # A RunProgressEvent, as the catalogue documents (the society's consumer decodes that).
        event_id = f"{progress.run_id}.{progress.state}.{progress.generation}.{progress.evaluations_done}"
        now = Timestamp()
        now.GetCurrentTime()
        event = events_pb2.RunProgressEvent(
            meta=EventMeta(event_id=event_id, time=now, source="optimizer"), progress=progress
        )
        try:
            await self._publisher.publish(self._catalogue.run_progress(progress.run_id), event, msg_id=event_id)
        except Exception as exc:  # noqa: BLE001 - progress is informational; the run row is the truth
            log.warning("run progress not published", run_id=progress.run_id, error=repr(exc))


def _fingerprint(config: dict[str, Any]) -> str | None:
    try:
        return parse_run_config(config).search_space.to_space().fingerprint()
    except Exception:  # noqa: BLE001 - an old run whose config no longer parses is not a prior
        return None


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


STATES = {
    "pending": runs_pb2.RUN_STATE_PENDING,
    RUNNING: runs_pb2.RUN_STATE_RUNNING,
    SUCCEEDED: runs_pb2.RUN_STATE_SUCCEEDED,
    FAILED: runs_pb2.RUN_STATE_FAILED,
    CANCELLED: runs_pb2.RUN_STATE_CANCELLED,
}


def content_type(artifact: str) -> str:
    return CONTENT_TYPES[artifact[artifact.rfind(".") :]]


def progress_message(row: RunRow) -> runs_pb2.RunProgress:
    """The run's progress as published on the bus and streamed by WatchRun."""
    return runs_pb2.RunProgress(
        run_id=row.run_id,
        state=STATES[row.state],
        generation=row.generation,
        generations_total=row.generations_total,
        evaluations_done=row.evaluations_done,
        evaluations_total=row.evaluations_budget,
        best_score=row.best_score or 0.0,
        best_config=struct_of(row.best_config),
        evaluations_failed=int((row.search_state or {}).get("failed", 0)),
    )


# Errors that every candidate of the run would get (the config, not the candidate, is wrong):
# the evaluator lacks the credential variable, or cannot import the target or a metric.
_CONFIG_ERRORS = ("is not set on this evaluator", "cannot be imported")


def _config_error(error: str) -> bool:
    return any(marker in error for marker in _CONFIG_ERRORS)


def _judge_outcome(results: report.RunResults, config: dict[str, Any]) -> tuple[str, str] | None:
    """(FAILED, why) when more than ``execution.max_failure_ratio`` of the evaluations failed
    (or none was made); None when the run stands as succeeded."""
    outcome = report.outcome(results)
    try:
        ratio = parse_run_config(config).optimization.execution.max_failure_ratio
    except Exception:  # noqa: BLE001 - the config parsed at StartRun; keep the default if it no longer does
        ratio = 0.5
    if outcome.total == 0:
        return FAILED, "no evaluation was made"
    if outcome.failed / outcome.total > ratio:
        top = (
            f"; most common error ({outcome.top_errors[0][1]}x): {outcome.top_errors[0][0]}"
            if outcome.top_errors
            else ""
        )
        return FAILED, (
            f"{outcome.failed} of {outcome.total} evaluations failed (more than "
            f"optimization.execution.max_failure_ratio {ratio:g}){top}"
        )
    return None


async def _results(session: AsyncSession, row: RunRow, *, state: str) -> report.RunResults:
    candidates = (await session.scalars(select(RunCandidateRow).where(RunCandidateRow.run_id == row.run_id))).all()
    evaluations = (
        await session.scalars(
            select(RunEvaluationRow).where(RunEvaluationRow.run_id == row.run_id).order_by(RunEvaluationRow.seq)
        )
    ).all()
    generation = {c.candidate_id: c.generation for c in candidates}
    return report.RunResults(
        run_id=row.run_id,
        name=row.name,
        config=row.config,
        candidates=[report.Candidate(c.candidate_id, c.generation, c.config, c.origin) for c in candidates],
        evaluations=[
            report.Evaluation(
                candidate_id=e.candidate_id,
                generation=generation.get(e.candidate_id, 0),
                test_case_id=e.test_case_id,
                score=e.score,
                latency_ms=e.latency_ms,
                cost_usd=e.cost_usd,
                components=dict(e.components or {}),
                output=e.output,
                error=e.error,
            )
            for e in evaluations
        ],
        state=state,
        stopped_because=row.stopped_because,
        best_candidate_id=((row.search_state or {}).get("best") or {}).get("candidate_id", ""),
        warnings=tuple(config_warnings(row.config)),
    )


def config_warnings(config: dict[str, Any]) -> list[str]:
    """The stored config's warnings (fields read but not acted on)."""
    try:
        return parse_run_config(config).warnings()
    except Exception:  # noqa: BLE001 - an old run whose config no longer parses has none to give
        return []
