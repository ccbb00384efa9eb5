"""Background judgements about arms, made by one replica at a time (a PostgreSQL advisory
lock elects it each tick): persist the incumbent chosen by the stability rule, promote or
retire canary arms by their posterior, and drop expired window buckets."""

from __future__ import annotations

import asyncio

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.logging import get_logger
from flywheel.optimizer import posterior, service, stats
from flywheel.optimizer.cache import PosteriorCache
from flywheel.optimizer.policies import canary
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.snapshot import EndpointSnapshot
from flywheel.optimizer.spec import ACTIVE, CANARY, LINEAR, RETIRED, PolicyConfig

log = get_logger(__name__)
LOCK_KEY = 0x0F1A_3EE1  # any constant shared by all optimizer replicas
DRAWS = 4000


def canary_verdicts(snap: EndpointSnapshot, rng: np.random.Generator) -> dict[str, str]:
    """arm_id -> "promote" | "retire" for canaries that have a verdict."""
    shown = PolicyConfig(kind="thompson_gaussian") if snap.policy.kind == LINEAR else snap.policy
    actives = [i for i, s in enumerate(snap.statuses) if s == ACTIVE]
    if not actives:
        return {}
    reference = (
        snap.arm_ids.index(snap.incumbent)
        if snap.incumbent in snap.arm_ids
        else max(actives, key=lambda i: snap.means[i])
    )
    out = {}
    for i, status in enumerate(snap.statuses):
        if status != CANARY or snap.pulls[i] < 1:
            continue
        pair = Stats(snap.stats.w[[i, reference]], snap.stats.s[[i, reference]], snap.stats.ss[[i, reference]])
        d = posterior.draws(shown, pair, rng, DRAWS)
        p_better = canary.probability_better(d[:, 0], d[:, 1])
        # Both verdicts need min_pulls; a canary on trial gets a fixed share of traffic until
        # it has them (snapshot.trial_share_vector), so it is never starved of a verdict.
        verdict = canary.canary_verdict(
            p_better,
            snap.pulls[i],
            min_pulls=snap.policy.canary_min_pulls,
            promote_probability=snap.policy.canary_promote_probability,
            retire_probability=snap.policy.canary_retire_probability,
        )
        if verdict == "continue":
            continue
        out[snap.arm_ids[i]] = verdict
        log.info(
            "canary verdict",
            endpoint=snap.name,
            arm_id=snap.arm_ids[i],
            verdict=verdict,
            p_better=round(p_better, 4),
            pulls=int(snap.pulls[i]),
        )
    return out


class ArmLifecycle:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], cache: PosteriorCache, *, interval_s: float = 2.0
    ) -> None:
        self._sessions = sessions
        self._cache = cache
        self._interval = interval_s
        self._rng = np.random.default_rng()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.tick()
            except Exception as exc:  # noqa: BLE001 - try again next tick
                log.warning("arm lifecycle tick failed", error=repr(exc))

    async def tick(self) -> None:
        async with self._sessions() as session:
            locked = (await session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY})).scalar()
            if not locked:
                return  # another replica judges this tick
            changed = set()
            # In name order, as the decision log locks endpoint rows: no deadlock between them.
            for snap in sorted(self._cache.snapshots(), key=lambda s: s.name):
                if snap.incumbent != snap.stored_incumbent:
                    await service.set_incumbent(session, endpoint=snap.name, arm_id=snap.incumbent)
                    changed.add(snap.name)
                for arm_id, verdict in canary_verdicts(snap, self._rng).items():
                    status = ACTIVE if verdict == "promote" else RETIRED
                    await service.set_arm_status(session, endpoint=snap.name, arm_id=arm_id, status=status)
                    changed.add(snap.name)
                await stats.drop_expired_buckets(session, endpoint=snap.name, policy=snap.policy)
            await session.commit()
        for name in changed:
            await self._cache.changed(name)  # reloaded here, announced to the other replicas
