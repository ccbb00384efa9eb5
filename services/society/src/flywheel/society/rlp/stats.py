"""RLP's figures for GetStats (and its Prometheus gauges): steps and why they failed, the
rewards (mean, trend over the last ones, how they were defined), the buffer, the proposals'
hit rate (did they beat their generation's median?), the policy in use and its GRPO jobs.

Reward figures are over the experiences still in the buffer (the oldest beyond
``buffer_size`` are dropped)."""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.api.society.v1 import society_service_pb2 as pb
from flywheel.society.models import RlpExperienceRow, RlpPolicyRow, RlpProposalRow, RlpStepRow
from flywheel.society.rlp.policy_training import jobs_of

TREND_WINDOW = 50
# A trend is "improving"/"declining" when the fitted line moves the reward by more than this
# share of the rewards' standard deviation over the window; "stable" otherwise.
TREND_THRESHOLD = 0.25


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx


def trend_label(values: list[float], *, threshold: float = TREND_THRESHOLD) -> tuple[float, str]:
    """(slope, "improving" | "stable" | "declining") over ``values`` in order."""
    s = slope(values)
    if len(values) < 3:
        return s, "stable"
    spread = statistics.pstdev(values)
    moved = s * (len(values) - 1)
    if spread == 0 or abs(moved) <= threshold * spread:
        return s, "stable"
    return s, "improving" if moved > 0 else "declining"


async def rlp_stats(session: AsyncSession, run_id: str | None) -> pb.RlpStats:
    """RLP's figures over every run, or one run's (``run_id``)."""
    out = pb.RlpStats()

    def only(q: Any, column: Any) -> Any:  # a filter on the run when one is asked for
        return q.where(column == run_id) if run_id else q

    steps = await session.execute(
        only(select(RlpStepRow.state, RlpStepRow.reason, func.count()), RlpStepRow.run_id)
        .where(RlpStepRow.state != "thinking")
        .group_by(RlpStepRow.state, RlpStepRow.reason)
    )
    for state, reason, n in steps:
        out.steps += n
        if state == "failed":
            out.steps_failed += n
            out.failures[reason or "unknown"] += n

    count, mean = (
        await session.execute(only(select(func.count(), func.avg(RlpExperienceRow.reward)), RlpExperienceRow.run_id))
    ).one()
    out.thoughts_rewarded = int(count or 0)
    out.buffer_size = int(count or 0)
    out.mean_reward = float(mean or 0.0)
    last = (
        await session.scalars(
            only(select(RlpExperienceRow.reward), RlpExperienceRow.run_id)
            .order_by(RlpExperienceRow.id.desc())
            .limit(TREND_WINDOW)
        )
    ).all()
    out.reward_trend, out.trend = trend_label([float(r) for r in reversed(last)])
    for definition, n in await session.execute(
        only(select(RlpExperienceRow.definition, func.count()), RlpExperienceRow.run_id).group_by(
            RlpExperienceRow.definition
        )
    ):
        out.reward_definitions[definition] = n

    made, resolved, hits = (
        await session.execute(
            only(
                select(
                    func.count(),
                    func.count(RlpProposalRow.hit),
                    func.count().filter(RlpProposalRow.hit.is_(True)),
                ),
                RlpProposalRow.run_id,
            )
        )
    ).one()
    out.proposals, out.proposals_resolved = int(made or 0), int(resolved or 0)
    out.hit_rate = (hits / resolved) if resolved else 0.0

    policies = select(RlpPolicyRow)
    if run_id:
        spaces = select(RlpStepRow.space_fingerprint).where(RlpStepRow.run_id == run_id).distinct()
        policies = policies.where(RlpPolicyRow.space_fingerprint.in_(spaces))
    rows = list((await session.scalars(policies.order_by(RlpPolicyRow.updated_at.desc()))).all())
    out.training_jobs = sum(len(jobs_of(r)) for r in rows)
    out.policy_model = next((r.policy_model for r in rows if r.policy_model), "")
    return out
