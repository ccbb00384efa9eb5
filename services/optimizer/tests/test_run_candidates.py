"""A run's history (RunService.ListRunCandidates) on a real PostgreSQL: one row per candidate
with the mean of its stored scores, evaluations and failures counted, candidates without
evaluations yet at 0, ordered by generation then id, min_generation and the answer's bound
(the newest generations kept), and bad requests named."""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from flywheel.core.db import create_engine, session_factory
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.core.settings import DatabaseSettings
from flywheel.optimizer.models import RunCandidateRow, RunEvaluationRow, RunRow
from flywheel.optimizer.runs import service
from flywheel.stack.testing import migrate_in_process as migrate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def sessions(stack_env, monkeypatch):
    migrate("optimizer", stack_env)
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    engine = create_engine(DatabaseSettings())  # type: ignore[call-arg]
    try:
        yield session_factory(engine)
    finally:
        await engine.dispose()


async def _run(sessions, run_id: str, *, generation: int, candidates: list[dict], evaluations: list[dict]) -> None:
    async with sessions() as session, session.begin():
        session.add(
            RunRow(
                run_id=run_id,
                name="t",
                state="running",
                config={},
                generation=generation,
                generations_total=5,
                evaluations_budget=100,
                artifacts={},
            )
        )
        await session.flush()
        if candidates:
            await session.execute(insert(RunCandidateRow), [{"run_id": run_id, **c} for c in candidates])
        if evaluations:
            await session.execute(
                insert(RunEvaluationRow),
                [
                    {"run_id": run_id, "request_id": f"{e['candidate_id']}/{e['test_case_id']}", **e}
                    for e in evaluations
                ],
            )


async def test_candidates_with_their_scores_so_far(sessions):
    candidates = [
        {"candidate_id": "c-b", "generation": 0, "config": {"prefix": "", "t": 0.5}, "origin": "search"},
        {"candidate_id": "c-a", "generation": 0, "config": {"prefix": "A: ", "t": 1}, "origin": "search"},
        {"candidate_id": "c-r", "generation": 1, "config": {"prefix": "", "t": 0.1}, "origin": "rlp"},
        {"candidate_id": "c-new", "generation": 1, "config": {"prefix": "W"}, "origin": "search"},
    ]
    evaluations = [
        {"candidate_id": "c-b", "test_case_id": "q0", "score": 1.0},
        {"candidate_id": "c-b", "test_case_id": "q1", "score": 0.5},
        {"candidate_id": "c-a", "test_case_id": "q0", "score": 0.2},
        {"candidate_id": "c-a", "test_case_id": "q1", "score": 0.0, "error": "HTTP 500"},
        {"candidate_id": "c-a", "test_case_id": "q2", "score": 0.4, "error": ""},
        {"candidate_id": "c-r", "test_case_id": "q0", "score": 0.9},
    ]
    await _run(sessions, "run-hist", generation=1, candidates=candidates, evaluations=evaluations)
    # Another run's rows never leak into this one's answer.
    await _run(
        sessions,
        "run-other",
        generation=0,
        candidates=[{"candidate_id": "c-b", "generation": 0, "config": {}, "origin": "search"}],
        evaluations=[{"candidate_id": "c-b", "test_case_id": "q9", "score": 0.0, "error": "boom"}],
    )

    async with sessions() as session:
        row, found = await service.list_candidates(session, run_id="run-hist")
    assert row.generation == 1
    assert [(c.candidate_id, c.generation, c.origin) for c in found] == [
        ("c-a", 0, "search"),
        ("c-b", 0, "search"),
        ("c-new", 1, "search"),
        ("c-r", 1, "rlp"),
    ]
    by_id = {c.candidate_id: c for c in found}
    assert by_id["c-a"].mean_score == pytest.approx(0.2) and (
        by_id["c-a"].cases_evaluated,
        by_id["c-a"].cases_failed,
    ) == (3, 1)
    assert by_id["c-b"].mean_score == pytest.approx(0.75) and (
        by_id["c-b"].cases_evaluated,
        by_id["c-b"].cases_failed,
    ) == (2, 0)
    assert (by_id["c-new"].mean_score, by_id["c-new"].cases_evaluated, by_id["c-new"].cases_failed) == (0.0, 0, 0)
    assert by_id["c-a"].config == {"prefix": "A: ", "t": 1} and isinstance(by_id["c-a"].config["t"], int)

    async with sessions() as session:
        _, later = await service.list_candidates(session, run_id="run-hist", min_generation=1)
        _, none = await service.list_candidates(session, run_id="run-hist", min_generation=7)
    assert [c.candidate_id for c in later] == ["c-new", "c-r"] and none == []


async def test_the_answer_is_bounded_keeping_the_newest_generations(sessions):
    candidates = [
        {"candidate_id": f"c{g}-{i}", "generation": g, "config": {"i": i}, "origin": "search"}
        for g in range(3)
        for i in range(4)
    ]
    await _run(sessions, "run-big", generation=2, candidates=candidates, evaluations=[])
    async with sessions() as session:
        _, found = await service.list_candidates(session, run_id="run-big", limit=6)
    # the newest 6 by (generation, id), still read oldest first
    assert [c.candidate_id for c in found] == ["c1-2", "c1-3", "c2-0", "c2-1", "c2-2", "c2-3"]
    assert service.MAX_CANDIDATES == 10_000


async def test_unknown_runs_and_bad_arguments_are_named(sessions):
    async with sessions() as session:
        with pytest.raises(NotFound, match="run-nope"):
            await service.list_candidates(session, run_id="run-nope")
        with pytest.raises(InvalidArgument, match="run_id"):
            await service.list_candidates(session, run_id="")
        with pytest.raises(InvalidArgument, match="min_generation: must be >= 0, got -1"):
            await service.list_candidates(session, run_id="run-nope", min_generation=-1)
