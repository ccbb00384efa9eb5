"""RLP's rows in PostgreSQL: steps, proposals, the experience buffer and the per-space policy
(reward normaliser, reasoning model in use). Every write is safe to repeat: a step is claimed
with ``ON CONFLICT DO NOTHING`` on (run, generation), an experience on (step, thought), so
two replicas or a redelivered event make one step and one experience per thought."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.society.models import RlpExperienceRow, RlpPolicyRow, RlpProposalRow, RlpStepRow

THINKING, PROPOSED, REWARDED, FAILED = "thinking", "proposed", "rewarded", "failed"


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def step_id_for(run_id: str, generation: int) -> str:
    """Deterministic: the same (run, generation) is the same step on every replica."""
    return "rlp-" + hashlib.sha256(f"{run_id}\0{generation}".encode()).hexdigest()[:28]


def proposal_id_for(step_id: str, key: str) -> str:
    """The ProposalEvent's event id (and JetStream msg id): a republished proposal is the same."""
    return f"{step_id}-" + hashlib.sha256(key.encode()).hexdigest()[:20]


async def get_step(session: AsyncSession, run_id: str, generation: int) -> RlpStepRow | None:
    return await session.get(RlpStepRow, step_id_for(run_id, generation))


async def claim_step(
    session: AsyncSession, *, run_id: str, generation: int, space_fingerprint: str, model: str = ""
) -> bool:
    """Insert the step as ``thinking``; False when it exists (another replica or an earlier
    delivery has it). Commits."""
    done = await session.execute(
        insert(RlpStepRow)
        .values(
            step_id=step_id_for(run_id, generation),
            run_id=run_id,
            generation=generation,
            space_fingerprint=space_fingerprint,
            state=THINKING,
            reason="",
            detail="",
            model=model,
            context="",
            thoughts=[],
        )
        .on_conflict_do_nothing()
    )
    await session.commit()
    return bool(_rowcount(done))


async def fail_step(session: AsyncSession, step_id: str, reason: str, detail: str = "") -> None:
    """Mark a step failed with its reason (commits)."""
    await session.execute(
        update(RlpStepRow)
        .where(RlpStepRow.step_id == step_id)
        .values(state=FAILED, reason=reason, detail=detail[:2000], resolved_at=func.now())
    )
    await session.commit()


async def release_claim(session: AsyncSession, step_id: str) -> None:
    """Forget a step still ``thinking`` (its writer failed before deciding); commits."""
    await session.execute(delete(RlpStepRow).where(RlpStepRow.step_id == step_id, RlpStepRow.state == THINKING))
    await session.commit()


async def release_stale(session: AsyncSession, run_id: str, older_than_s: float) -> int:
    """Steps left ``thinking`` by a replica that died: failed with reason ``abandoned``."""
    cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
    done = await session.execute(
        update(RlpStepRow)
        .where(RlpStepRow.run_id == run_id, RlpStepRow.state == THINKING, RlpStepRow.created_at < cutoff)
        .values(state=FAILED, reason="abandoned", detail="the replica writing it stopped", resolved_at=func.now())
    )
    await session.commit()
    return _rowcount(done)


async def open_steps(session: AsyncSession, run_id: str, *, before_generation: int | None) -> list[RlpStepRow]:
    """The run's steps whose proposals await their results, oldest first."""
    q = select(RlpStepRow).where(RlpStepRow.run_id == run_id, RlpStepRow.state == PROPOSED)
    if before_generation is not None:
        q = q.where(RlpStepRow.generation < before_generation)
    return list((await session.scalars(q.order_by(RlpStepRow.generation))).all())


async def proposals_of(session: AsyncSession, step_id: str) -> list[RlpProposalRow]:
    q = select(RlpProposalRow).where(RlpProposalRow.step_id == step_id).order_by(RlpProposalRow.proposal_id)
    return list((await session.scalars(q)).all())


async def few_shot(session: AsyncSession, space_fingerprint: str, k: int) -> list[dict[str, str]]:
    """The ``k`` best-rewarded experiences of the space (by normalised reward), distinct thoughts."""
    if k <= 0:
        return []
    rows = await session.execute(
        select(RlpExperienceRow.thought, RlpExperienceRow.outcome)
        .where(RlpExperienceRow.space_fingerprint == space_fingerprint)
        .order_by(RlpExperienceRow.normalized_reward.desc(), RlpExperienceRow.id.desc())
        .limit(k * 4)
    )
    out, seen = [], set()
    for thought, outcome in rows:
        if thought in seen:
            continue
        seen.add(thought)
        out.append({"thought": thought, "outcome": outcome})
        if len(out) == k:
            break
    return out


async def policy_for_update(session: AsyncSession, space_fingerprint: str) -> RlpPolicyRow:
    """The space's policy row, created when missing, locked until the transaction ends (the
    normaliser is read, updated and written back without losing a concurrent update)."""
    await session.execute(
        insert(RlpPolicyRow)
        .values(space_fingerprint=space_fingerprint, normalizer={}, policy_model="", training_job_id="")
        .on_conflict_do_nothing()
    )
    row = await session.scalar(
        select(RlpPolicyRow).where(RlpPolicyRow.space_fingerprint == space_fingerprint).with_for_update()
    )
    assert row is not None
    return row


async def get_policy(session: AsyncSession, space_fingerprint: str) -> RlpPolicyRow | None:
    return await session.get(RlpPolicyRow, space_fingerprint)


async def add_experiences(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> int:
    """Insert experiences (one per rewarded thought); a repeat inserts nothing."""
    if not rows:
        return 0
    done = await session.execute(insert(RlpExperienceRow).values(list(rows)).on_conflict_do_nothing())
    return _rowcount(done)


async def cap_buffer(session: AsyncSession, space_fingerprint: str, capacity: int) -> int:
    """Delete the space's oldest experiences beyond ``capacity``; returns how many went."""
    newest_dropped = (
        select(RlpExperienceRow.id)
        .where(RlpExperienceRow.space_fingerprint == space_fingerprint)
        .order_by(RlpExperienceRow.id.desc())
        .offset(capacity)
        .limit(1)
        .scalar_subquery()
    )
    done = await session.execute(
        delete(RlpExperienceRow).where(
            RlpExperienceRow.space_fingerprint == space_fingerprint, RlpExperienceRow.id <= newest_dropped
        )
    )
    return _rowcount(done)


async def buffer_size(session: AsyncSession, space_fingerprint: str) -> int:
    q = select(func.count()).where(RlpExperienceRow.space_fingerprint == space_fingerprint)
    return int(await session.scalar(q.select_from(RlpExperienceRow)) or 0)


async def run_step_rewards(session: AsyncSession, run_id: str) -> list[tuple[str, int, float]]:
    """(step_id, generation, mean normalised reward) of the run's rewarded steps, in order."""
    rows = await session.execute(
        select(RlpExperienceRow.step_id, RlpExperienceRow.generation, func.avg(RlpExperienceRow.normalized_reward))
        .where(RlpExperienceRow.run_id == run_id)
        .group_by(RlpExperienceRow.step_id, RlpExperienceRow.generation)
        .order_by(RlpExperienceRow.generation)
    )
    return [(s, int(g), float(m)) for s, g, m in rows]


async def set_step_gae(session: AsyncSession, step_id: str, step_mean: float, advantage: float) -> None:
    """A thought's GAE advantage: its step's (over the run's generations) plus its own
    deviation from the step's mean normalised reward."""
    await session.execute(
        update(RlpExperienceRow)
        .where(RlpExperienceRow.step_id == step_id)
        .values(gae_advantage=RlpExperienceRow.normalized_reward - step_mean + advantage)
    )
