"""Off-policy evaluation over the decision log: joins decisions with their applied
feedback and runs IPS, SNIPS and doubly robust (flywheel.optimizer.ope) for a candidate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.core.errors import FailedPrecondition, InvalidArgument
from flywheel.optimizer import ope
from flywheel.optimizer.snapshot import EndpointSnapshot


@dataclass(frozen=True)
class Candidate:
    """Exactly one of: an arm, a distribution over arms, or the current posterior."""

    arm_id: str = ""
    distribution: dict[str, float] | None = None
    current_posterior: bool = False


@dataclass(frozen=True)
class OpeResult:
    estimates: list[ope.Estimate]
    samples: int
    logged_value: float
    effective_sample_size: float


def target_distribution(snap: EndpointSnapshot, candidate: Candidate) -> np.ndarray:
    k = len(snap.arm_ids)
    if candidate.arm_id:
        if candidate.arm_id not in snap.arm_ids:
            raise InvalidArgument(f"arm {candidate.arm_id!r} is not an arm of {snap.name!r}")
        p = np.zeros(k)
        p[snap.arm_ids.index(candidate.arm_id)] = 1.0
        return p
    if candidate.distribution is not None:
        unknown = set(candidate.distribution) - set(snap.arm_ids)
        if unknown:
            raise InvalidArgument(f"distribution names arms that {snap.name!r} does not have: {sorted(unknown)}")
        p = np.array([candidate.distribution.get(a, 0.0) for a in snap.arm_ids])
        if np.any(~np.isfinite(p)) or np.any(p < 0) or not np.isclose(p.sum(), 1.0, atol=1e-6):
            raise InvalidArgument("distribution probabilities must be >= 0 and sum to 1")
        return p / p.sum()
    if candidate.current_posterior:
        return snap.probabilities
    raise InvalidArgument("choose a candidate: arm_id, distribution or current_posterior")


async def estimate(
    session: AsyncSession,
    *,
    snap: EndpointSnapshot,
    candidate: Candidate,
    since: datetime | None,
    until: datetime | None,
    confidence: float = 0.95,
) -> OpeResult:
    if not 0 < confidence < 1:
        raise InvalidArgument("confidence must be in (0, 1)")
    p = target_distribution(snap, candidate)
    # Sticky decisions repeat an earlier choice (propensity 1 by construction): not samples.
    rows = (
        await session.execute(
            text("""
        SELECT d.arm_id, d.probability, avg(f.reward) AS reward
        FROM decisions d JOIN applied_feedback f ON f.decision_id = d.decision_id
        WHERE d.endpoint = :endpoint AND NOT d.sticky
          AND (CAST(:since AS timestamptz) IS NULL OR d.created_at >= :since)
          AND (CAST(:until AS timestamptz) IS NULL OR d.created_at < :until)
        GROUP BY d.decision_id, d.arm_id, d.probability
    """),
            {"endpoint": snap.name, "since": since, "until": until},
        )
    ).all()
    if not rows:
        raise FailedPrecondition(f"no decisions with feedback for {snap.name!r} in that time range")
    index = {a: i for i, a in enumerate(snap.arm_ids)}
    try:
        data = ope.LoggedData(
            actions=np.array([index[r.arm_id] for r in rows]),
            rewards=np.array([r.reward for r in rows], dtype=float),
            propensities=np.array([r.probability for r in rows], dtype=float),
            n_arms=len(snap.arm_ids),
        )
        target = ope.fixed_distribution(p, data.n)
        model = ope.per_arm_mean_model(data)
        estimates = [
            ope.ips(data, target, confidence=confidence),
            ope.snips(data, target, confidence=confidence),
            ope.doubly_robust(data, target, model, confidence=confidence),
        ]
        ess = ope.effective_sample_size(ope.importance_weights(data, target))
    except ValueError as exc:  # e.g. the candidate never chooses any logged arm
        raise FailedPrecondition(f"cannot estimate on these logs: {exc}") from None
    return OpeResult(
        estimates=estimates, samples=data.n, logged_value=float(data.rewards.mean()), effective_sample_size=ess
    )
