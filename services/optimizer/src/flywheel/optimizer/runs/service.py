"""Run operations behind RunService and the proposals consumer (keyword-only, session first)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import FailedPrecondition, InvalidArgument, NotFound
from flywheel.optimizer.models import RunRow
from flywheel.optimizer.runconfig import RunConfigError, parse_run_config
from flywheel.optimizer.runs.driver import ARTIFACTS, CANCELLED, RUNNING

MAX_LIST = 500


async def start_run(session: AsyncSession, *, config: dict[str, Any], name: str = "") -> RunRow:
    """Validate the config and create a running run (the driver picks it up on its next tick)."""
    try:
        parsed = parse_run_config(config)
    except RunConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    if parsed.evaluation.test_cases.path:
        raise InvalidArgument(
            "evaluation.test_cases.path: the optimizer cannot read files on your machine; send the test "
            "cases inline (evaluation.test_cases.inline) — `flywheel optimize` inlines the file for you"
        )
    try:
        cases = parsed.test_cases()
    except (RunConfigError, ValueError) as exc:
        raise InvalidArgument(str(exc)) from None
    if not cases:
        raise InvalidArgument("evaluation.test_cases: a run needs at least one test case")
    evo = parsed.optimization.evolution
    budget = parsed.optimization.max_evaluations or evo.population_size * evo.generations * len(cases)
    row = RunRow(
        run_id=f"run-{uuid.uuid4().hex[:16]}",
        name=name or parsed.api.name,
        state=RUNNING,
        config=config,
        generations_total=evo.generations,
        evaluations_budget=budget,
        artifacts={},
    )
    session.add(row)
    await session.commit()
    await session.refresh(row)
    return row


async def get_run(session: AsyncSession, *, run_id: str) -> RunRow:
    if not run_id:
        raise InvalidArgument("run_id is empty")
    row = await session.get(RunRow, run_id)
    if row is None:
        raise NotFound(f"run {run_id!r} does not exist")
    return row


async def list_runs(session: AsyncSession, *, limit: int = 50, state: str | None = None) -> list[RunRow]:
    if limit < 0:
        raise InvalidArgument(f"limit must be >= 0, got {limit}")
    query = select(RunRow).order_by(RunRow.created_at.desc()).limit(min(limit or 50, MAX_LIST))
    if state:
        query = query.where(RunRow.state == state)
    return list((await session.scalars(query)).all())


async def cancel_run(session: AsyncSession, *, run_id: str) -> RunRow:
    """Stop a running run; its requests still in the queue are answered and ignored."""
    row = await get_run(session, run_id=run_id)
    if row.state == RUNNING:
        row.state = CANCELLED
        row.stopped_because = "cancelled"
        await session.commit()
        await session.refresh(row)
    return row


def artifact_key(row: RunRow, name: str) -> str:
    if name not in ARTIFACTS:
        raise InvalidArgument(f"unknown artifact {name!r}; one of {', '.join(ARTIFACTS)}")
    if name not in (row.artifacts or {}):
        raise FailedPrecondition(f"run {row.run_id!r} has no {name} yet (state {row.state}); wait until it finishes")
    return f"{row.run_id}/{name}"


_INSERT_INJECTION = text(
    "INSERT INTO run_injections (injection_id, run_id, configs, origin)"
    " VALUES (:injection_id, :run_id, CAST(:configs AS json), :origin) ON CONFLICT DO NOTHING"
)


async def inject(
    session: AsyncSession, *, run_id: str, configs: list[dict[str, Any]], origin: str, injection_id: str
) -> bool:
    """Queue configs for the run's running generation; False when this injection id was seen.
    The config values are checked against the run's search space here, so a bad proposal is
    refused at once instead of failing the run."""
    import json

    row = await get_run(session, run_id=run_id)
    if row.state != RUNNING:
        raise FailedPrecondition(f"run {run_id!r} is {row.state}; proposals only go into running runs")
    space = parse_run_config(row.config).search_space.to_space()
    for config in configs:
        try:
            space.coerce(config)
        except (KeyError, ValueError) as exc:
            raise InvalidArgument(f"proposed config does not fit the run's search space: {exc}") from None
    done = await session.execute(
        _INSERT_INJECTION,
        {"injection_id": injection_id, "run_id": run_id, "configs": json.dumps(configs), "origin": origin},
    )
    await session.commit()
    return bool(done.rowcount)
