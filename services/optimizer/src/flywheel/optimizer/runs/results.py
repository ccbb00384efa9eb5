"""Evaluation results into ``run_evaluations``: one row per (run, candidate, test case).

The primary key makes the fold exactly-once: a redelivered result, or a second result for a
request published again after a restart, inserts nothing. The run driver reads new rows by
``seq`` and records them in the search.
"""

from __future__ import annotations

import json
import math

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.evaluator.v1.events_pb2 import EvaluationResult
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.validation import Invalid, check_number, check_numbers

_KNOWN = text(
    "SELECT r.run_id, c.candidate_id FROM run_candidates c JOIN runs r USING (run_id)"
    " WHERE r.run_id = ANY(:runs) AND c.candidate_id = ANY(:candidates)"
)
_INSERT = text(
    "INSERT INTO run_evaluations (run_id, candidate_id, test_case_id, request_id, score, components,"
    " latency_ms, cost_usd, output, error, trace_id)"
    " VALUES (:run_id, :candidate_id, :test_case_id, :request_id, :score, CAST(:components AS json),"
    " :latency_ms, :cost_usd, :output, :error, :trace_id)"
    " ON CONFLICT DO NOTHING"
)
# A stored output is for the report, not an archive: the trace store keeps the full text.
MAX_OUTPUT_CHARS = 4000


class EvaluationResultHandler:
    """Stores a batch of results in one transaction; results of unknown runs or candidates, and
    scores that are not finite numbers in [0, 1], are dead-lettered."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, batch: list[tuple[EvaluationResult, Delivery]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(batch)
        rows = []
        async with self._sessions() as session, session.begin():
            known = {
                (r.run_id, r.candidate_id)
                for r in await session.execute(
                    _KNOWN,
                    {
                        "runs": list({e.run_id for e, _ in batch}),
                        "candidates": list({e.candidate_id for e, _ in batch}),
                    },
                )
            }
            for i, (e, _) in enumerate(batch):
                problem = _problem(e, known)
                if problem:
                    outcomes[i] = Reject(problem)
                    continue
                error = e.error
                if not error and e.metric_errors and not e.components:
                    # nothing scored it (a custom metric that raises, the judge away): not a 0 of quality
                    name, why = sorted(e.metric_errors.items())[0]
                    error = f"no metric could be computed ({name}: {why})"
                rows.append(
                    {
                        "run_id": e.run_id,
                        "candidate_id": e.candidate_id,
                        "test_case_id": e.test_case_id,
                        "request_id": e.request_id,
                        # A failed evaluation scores 0: a config that breaks the target is a bad config.
                        "score": 0.0 if error else e.score,
                        "components": _json(dict(e.components)),
                        "latency_ms": e.latency_ms,
                        "cost_usd": e.cost_usd,
                        "output": e.output[:MAX_OUTPUT_CHARS],
                        "error": error,
                        "trace_id": e.trace_id,
                    }
                )
            if rows:
                await session.execute(_INSERT, rows)
        return outcomes


def _problem(e: EvaluationResult, known: set[tuple[str, str]]) -> str:
    if not (e.run_id and e.candidate_id and e.test_case_id and e.request_id):
        return "evaluation result needs run_id, candidate_id, test_case_id and request_id"
    if (e.run_id, e.candidate_id) not in known:
        return f"unknown run {e.run_id!r} or candidate {e.candidate_id!r}"
    if not e.error and not (math.isfinite(e.score) and 0.0 <= e.score <= 1.0):
        return f"score must be a finite number in [0, 1], got {e.score}"
    try:
        # Stored for the search and the report: an infinite latency or a NaN component would
        # sort, average and plot as garbage.
        check_number(e.latency_ms, "latency_ms", min_value=0.0)
        check_number(e.cost_usd, "cost_usd", min_value=0.0)
        check_numbers(e.components, "components")
    except Invalid as exc:
        return str(exc)
    return ""


def _json(value: dict[str, float]) -> str:
    return json.dumps({k: v for k, v in value.items() if math.isfinite(v)})
