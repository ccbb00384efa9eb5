"""RunService: start, watch, list, cancel batch runs, fetch their result files and read their
history (candidates with their scores so far)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import run_service_pb2 as pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as pb_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.values import plain_number
from flywheel.core.errors import InvalidArgument
from flywheel.core.objects import ObjectStore
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.validation import check_enum, check_number, check_string, check_struct
from flywheel.optimizer.models import RunRow
from flywheel.optimizer.runs import service
from flywheel.optimizer.runs.driver import (
    ARTIFACTS,
    BUCKET,
    RUNNING,
    STATES,
    config_warnings,
    content_type,
    progress_message,
)
from flywheel.optimizer.runs.requests import struct_of

_STATE_NAMES = {v: k for k, v in STATES.items()}
# A run config as sent (the run keeps it in a JSON column and in every evaluation request).
MAX_CONFIG_BYTES = 1024 * 1024


def _run_id(value: str) -> str:
    """A run id from a request: it fits its column (runs.run_id, 64) and holds no NUL."""
    return check_string(value, "run_id", max_len=64)


_OUTCOME = text(
    "SELECT run_id, count(*) AS done, count(*) FILTER (WHERE error <> '') AS failed,"
    " count(*) FILTER (WHERE error ILIKE '%timed out%' OR error ILIKE '%timeout%') AS timed_out"
    " FROM run_evaluations WHERE run_id = ANY(:runs) GROUP BY run_id"
)
_TOP_ERRORS = text(
    "SELECT split_part(error, ' (attempt ', 1) AS message, count(*) AS n FROM run_evaluations"
    " WHERE run_id = :run_id AND error <> '' GROUP BY 1 ORDER BY n DESC, 1 LIMIT 5"
)


async def outcomes(session: AsyncSession, rows: list[RunRow], *, top_errors: bool) -> dict[str, dict[str, Any]]:
    """Per run: evaluations done, failed, timed out (and, with top_errors, the most common
    messages), counted from run_evaluations."""
    found: dict[str, dict[str, Any]] = {r.run_id: {"done": 0, "failed": 0, "timed_out": 0, "top": []} for r in rows}
    if not rows:
        return found
    for r in await session.execute(_OUTCOME, {"runs": list(found)}):
        found[r.run_id].update(done=r.done, failed=r.failed, timed_out=r.timed_out)
    if top_errors:
        for run_id, counts in found.items():
            if counts["failed"]:
                counts["top"] = [(m.message[:500], m.n) for m in await session.execute(_TOP_ERRORS, {"run_id": run_id})]
    return found


def run_message(row: RunRow, outcome: dict[str, Any] | None = None, *, warnings: bool = True) -> runs_pb2.Run:
    """A run as the API returns it; ``warnings`` re-reads the stored config (not for lists)."""
    outcome = outcome or {}
    msg = runs_pb2.Run(
        run_id=row.run_id,
        state=STATES[row.state],
        config=struct_of(row.config),
        generation=row.generation,
        generations_total=row.generations_total,
        best_score=row.best_score or 0.0,
        best_config=struct_of(row.best_config),
        artifacts=row.artifacts or {},
        error=row.error,
        evaluations_done=int(outcome.get("done", row.evaluations_done)),
        evaluations_total=row.evaluations_budget,
        evaluations_failed=int(outcome.get("failed", (row.search_state or {}).get("failed", 0))),
        evaluations_timed_out=int(outcome.get("timed_out", 0)),
        top_errors=[runs_pb2.ErrorCount(message=m, count=n) for m, n in outcome.get("top", [])],
        warnings=config_warnings(row.config) if warnings else [],
    )
    msg.created_at.FromDatetime(row.created_at)
    return msg


async def _full(session: AsyncSession, row: RunRow) -> runs_pb2.Run:
    return run_message(row, (await outcomes(session, [row], top_errors=True))[row.run_id])


class RunServicer(pb_grpc.RunServiceServicer):
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        objects: ObjectStore,
        *,
        policy: RunPolicySettings,
        limits: service.RunLimits,
        watch_interval_s: float = 0.5,
    ) -> None:
        self._sessions = sessions
        self._objects = objects
        self._policy = policy
        self._limits = limits
        self._watch_interval_s = watch_interval_s

    async def StartRun(self, request: pb.StartRunRequest, context: grpc.aio.ServicerContext) -> pb.StartRunResponse:
        # Generic checks where the request enters (NaN, NUL, depth, size, naming the path);
        # what a config may mean is checked by service.start_run.
        check_struct(request.config, "config", max_bytes=MAX_CONFIG_BYTES)
        config = plain_number(json_format.MessageToDict(request.config))
        async with self._sessions() as session:
            row = await service.start_run(
                session, config=config, policy=self._policy, limits=self._limits, name=getattr(request, "name", "")
            )
        return pb.StartRunResponse(run=run_message(row, {}))

    async def GetRun(self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.GetRunResponse:
        async with self._sessions() as session:
            row = await service.get_run(session, run_id=_run_id(request.run_id))
            return pb.GetRunResponse(run=await _full(session, row))

    async def ListRuns(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        check_enum(request.state, runs_pb2.RunState, "state")
        state = _STATE_NAMES.get(request.state) if request.state else None
        async with self._sessions() as session:
            rows = await service.list_runs(session, limit=request.limit, state=state)
            counts = await outcomes(session, rows, top_errors=False)
        return pb.ListRunsResponse(runs=[run_message(r, counts[r.run_id], warnings=False) for r in rows])

    async def CancelRun(self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext) -> pb.CancelRunResponse:
        run_id = _run_id(request.run_id)
        async with self._sessions() as session:
            row = await service.cancel_run(session, run_id=run_id)
            return pb.CancelRunResponse(run=await _full(session, row))

    async def WatchRun(
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchRunResponse]:
        """Progress each time the run moves (and once at the start); ends when the run ends."""
        last: tuple[Any, ...] | None = None
        while True:
            async with self._sessions() as session:
                row = await service.get_run(session, run_id=_run_id(request.run_id))
            seen = (row.state, row.generation, row.evaluations_done, bool(row.artifacts))
            if seen != last:
                last = seen
                yield pb.WatchRunResponse(progress=progress_message(row))
            # The driver writes the result files and leaves RUNNING in one transaction.
            if row.state != RUNNING:
                return
            await asyncio.sleep(self._watch_interval_s)

    async def GetRunArtifact(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.name:
            raise InvalidArgument(f"name is empty; one of {', '.join(ARTIFACTS)}")
        async with self._sessions() as session:
            row = await service.get_run(session, run_id=_run_id(request.run_id))
        key = service.artifact_key(row, request.name)
        content = await self._objects.get_bytes(BUCKET, key)
        return pb.GetRunArtifactResponse(name=request.name, content=content, content_type=content_type(request.name))

    async def ListRunCandidates(
        self, request: pb.ListRunCandidatesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRunCandidatesResponse:
        """The run's candidates (generation >= min_generation, at most service.MAX_CANDIDATES,
        the newest kept) with their mean score and evaluations so far, and the run's generation."""
        run_id = _run_id(request.run_id)
        check_number(request.min_generation, "min_generation", min_value=0)
        async with self._sessions() as session:
            row, found = await service.list_candidates(session, run_id=run_id, min_generation=request.min_generation)
        return pb.ListRunCandidatesResponse(
            candidates=[
                pb.RunCandidate(
                    candidate_id=c.candidate_id,
                    generation=c.generation,
                    config=struct_of(c.config),
                    origin=c.origin,
                    mean_score=c.mean_score,
                    cases_evaluated=c.cases_evaluated,
                    cases_failed=c.cases_failed,
                )
                for c in found
            ],
            generation=row.generation,
        )
