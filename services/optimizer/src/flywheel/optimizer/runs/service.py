"""Run operations behind RunService and the proposals consumer (keyword-only, session first)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import FailedPrecondition, InvalidArgument, NotFound
from flywheel.core.run_policy import RunPolicySettings, policy_problems
from flywheel.core.validation import Invalid
from flywheel.optimizer.models import RunCandidateRow, RunEvaluationRow, RunRow
from flywheel.optimizer.runconfig import RunConfig, RunConfigError, parse_run_config
from flywheel.optimizer.runs.driver import ARTIFACTS, CANCELLED, RUNNING
from flywheel.optimizer.runs.requests import model_urls

MAX_LIST = 500
# ListRunCandidates answers at most this many candidates (the newest generations are kept):
# a run's candidates are bounded by its caps (population x generations), this bounds the answer.
MAX_CANDIDATES = 10_000
_SETTING = "FLYWHEEL_OPTIMIZER_RUN_MAX_"


@dataclass(frozen=True)
class RunLimits:
    """The largest run this optimizer accepts (``FLYWHEEL_OPTIMIZER_RUN_MAX_*``): a run's search
    state lives in the optimizer, so its size is bounded before anything is built."""

    population: int
    generations: int
    test_cases: int
    evaluations: int
    parallel_workers: int


def policy_refusals(config: RunConfig, policy: RunPolicySettings) -> list[str]:
    """What the config names that the run policy refuses (``field.path: problem`` each): the
    same check the evaluator makes on every request built from it."""
    api, auth = config.api, config.api.auth
    envs = [(f"api.auth.{f}", v) for f, v in (("token_env", auth.token_env), ("password_env", auth.password_env)) if v]
    callables = [("api.callable", api.callable)] if api.callable else []
    callables += [
        (f"evaluation.metrics.{n}.callable", m.callable) for n, m in config.evaluation.metrics.items() if m.callable
    ]
    custom = config.evaluation.custom_evaluator
    if custom is not None and custom.enabled:
        callables.append(("evaluation.custom_evaluator", f"{custom.module}:{custom.function}"))
    urls = [("api.endpoint", api.endpoint)] if api.kind == "http" and api.endpoint else []
    urls += [(f"api.models.{key}.endpoint", url) for key, url in model_urls(config).items()]
    bases = [("api.api_base", api.api_base or "")] if api.kind == "llm" else []
    return policy_problems(policy, env_vars=envs, callables=callables, urls=urls, llm_api_bases=bases)


def evaluator_refusals(config: RunConfig) -> list[str]:
    """What every request of this run would be refused for by the evaluator anyway."""
    found = [
        f"evaluation.metrics.{name}: a custom metric needs a scorer: callable 'package.module:function', or "
        "evaluation.custom_evaluator (module, function) for The Convergence's function: custom metrics"
        for name in config.evaluation.unscored()
    ]
    api = config.api
    if api.kind == "http" and not (api.endpoint or "").strip() and not model_urls(config):
        found.append("api.endpoint: empty; an http target needs the URL to call")
    return found


def size_refusals(config: RunConfig, cases: int, limits: RunLimits) -> list[str]:
    """Every size of the run above this optimizer's caps, naming the field and the cap."""
    evo, execution = config.optimization.evolution, config.optimization.execution
    found = []
    for field, value, cap, setting in (
        ("optimization.evolution.population_size", evo.population_size, limits.population, "POPULATION"),
        ("optimization.evolution.generations", evo.generations, limits.generations, "GENERATIONS"),
        ("evaluation.test_cases", cases, limits.test_cases, "TEST_CASES"),
        (
            "optimization.execution.parallel_workers",
            execution.parallel_workers,
            limits.parallel_workers,
            "PARALLEL_WORKERS",
        ),
    ):
        if value > cap:
            found.append(f"{field}: {value} is above this optimizer's cap of {cap} ({_SETTING}{setting})")
    total = evo.population_size * evo.generations * cases
    budget = min(config.optimization.max_evaluations or total, total)
    if budget > limits.evaluations:
        found.append(
            f"optimization.max_evaluations: the run may take {budget} evaluations (population {evo.population_size}"
            f" x generations {evo.generations} x test cases {cases}), above this optimizer's cap of"
            f" {limits.evaluations} ({_SETTING}EVALUATIONS); lower one of them or set max_evaluations"
        )
    return found


async def start_run(
    session: AsyncSession,
    *,
    config: dict[str, Any],
    policy: RunPolicySettings,
    limits: RunLimits,
    name: str = "",
) -> RunRow:
    """Validate the config (its fields, the run policy, the size caps) and create a running
    run (the driver picks it up on its next tick)."""
    try:
        parsed = parse_run_config(config)
    except RunConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    refused = policy_refusals(parsed, policy) + evaluator_refusals(parsed)
    inline = parsed.evaluation.test_cases.inline
    if inline is not None and len(inline) > limits.test_cases:  # before augmentation multiplies them
        refused.append(
            f"evaluation.test_cases: {len(inline)} is above this optimizer's cap of {limits.test_cases}"
            f" ({_SETTING}TEST_CASES)"
        )
    if refused:
        raise InvalidArgument(str(RunConfigError(refused)))
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
    too_big = size_refusals(parsed, len(cases), limits)
    if too_big:
        raise InvalidArgument(str(RunConfigError(too_big)))
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


@dataclass(frozen=True)
class CandidateSummary:
    """One candidate of a run with its evaluations so far (a failed evaluation scores 0)."""

    candidate_id: str
    generation: int
    config: dict[str, Any]
    origin: str
    mean_score: float
    cases_evaluated: int
    cases_failed: int


async def list_candidates(
    session: AsyncSession, *, run_id: str, min_generation: int = 0, limit: int = MAX_CANDIDATES
) -> tuple[RunRow, list[CandidateSummary]]:
    """The run and its candidates of generations >= ``min_generation``, ordered by generation
    then candidate id, each with the mean score over its stored evaluations (0 when none yet)
    and how many failed. At most ``limit`` candidates: beyond it the oldest are left out (the
    newest generations are kept; the oldest one kept may be partial, ask again with a higher
    ``min_generation`` for less)."""
    if min_generation < 0:
        raise Invalid("min_generation", f"must be >= 0, got {min_generation}")
    row = await get_run(session, run_id=run_id)
    c, e = RunCandidateRow, RunEvaluationRow
    query = (
        select(
            c.candidate_id,
            c.generation,
            c.config,
            c.origin,
            func.avg(e.score).label("mean_score"),
            func.count(e.candidate_id).label("evaluated"),
            func.count().filter(e.error != "").label("failed"),
        )
        .select_from(c)
        .outerjoin(e, and_(e.run_id == c.run_id, e.candidate_id == c.candidate_id))
        .where(c.run_id == row.run_id, c.generation >= min_generation)
        # (run_id, candidate_id) is the key of run_candidates: its other columns may be selected.
        .group_by(c.run_id, c.candidate_id)
        .order_by(c.generation.desc(), c.candidate_id.desc())
        .limit(max(0, min(limit, MAX_CANDIDATES)))
    )
    found = [
        CandidateSummary(
            candidate_id=r.candidate_id,
            generation=r.generation,
            config=r.config or {},
            origin=r.origin,
            mean_score=float(r.mean_score or 0.0),
            cases_evaluated=int(r.evaluated),
            cases_failed=int(r.failed),
        )
        for r in await session.execute(query)
    ]
    found.reverse()  # newest first to cut at the limit; the answer reads oldest first
    return row, found


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
