"""An immutable view of one endpoint for the hot path: its arms, their posteriors and
the probability the policy gives each arm, computed once per refresh so that Select is a
single weighted draw and the logged propensity is exactly the sampling probability."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
from google.protobuf.struct_pb2 import Struct

from flywheel.optimizer import posterior, reweight
from flywheel.optimizer.policies import canary, ids, incumbent, selection
from flywheel.optimizer.posterior import Stats
from flywheel.optimizer.spec import ACTIVE, CANARY, IDS, LINEAR, RETIRED, PolicyConfig

# Joint posterior draws used to estimate selection probabilities.
PROPENSITY_DRAWS = 4000


@dataclass(frozen=True)
class EndpointSnapshot:
    name: str
    description: str
    policy: PolicyConfig
    reward_spec: dict[str, Any]
    arm_ids: list[str]
    params: list[dict[str, Any]]
    statuses: list[str]
    caps: np.ndarray
    pulls: np.ndarray
    reward_sums: np.ndarray
    stats: Stats
    # Over all arms; retired arms get 0.
    probabilities: np.ndarray
    probability_best: np.ndarray
    means: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    incumbent: str
    # The incumbent last written to the database (the stability rule starts from it).
    stored_incumbent: str
    created_at: datetime
    as_of: datetime
    # The joint draws behind ``probabilities`` when a later fold may reweight them instead of
    # drawing again (``reweight.py``): kept by rebuilds from folds, not by reads.
    draw_set: reweight.DrawSet | None = None
    # The effective sample size of ``draw_set``'s weights behind these probabilities, as a share
    # of its draws: 1 when they were just drawn; the cache draws again ahead as it falls.
    draw_ess: float = 1.0

    @cached_property
    def cdf(self) -> list[float]:
        """Cumulative ``probabilities`` as floats: Select draws an arm from it with bisect."""
        return [float(x) for x in np.cumsum(self.probabilities)]

    @cached_property
    def params_structs(self) -> list[Struct]:
        """Each arm's params as a Struct, built once: Select copies it into the response."""
        out = []
        for params in self.params:
            s = Struct()
            s.update(params)
            out.append(s)
        return out

    @property
    def live(self) -> np.ndarray:
        return np.array([s != RETIRED for s in self.statuses])

    def caps_of_live(self) -> np.ndarray:
        return np.array([c if s == CANARY else 1.0 for c, s in zip(self.caps, self.statuses, strict=True)])

    def probabilities_for(
        self, stats: Stats, rng: np.random.Generator, x: np.ndarray | None = None, m: int = PROPENSITY_DRAWS
    ) -> np.ndarray:
        """Selection probabilities over all arms for these statistics (retired arms 0)."""
        trial = trial_share_vector(self.policy, self.statuses, self.caps, self.pulls)
        return selection_probabilities(self.policy, stats, self.live, self.caps_of_live(), rng, x=x, m=m, trial=trial)

    def drawn_for(
        self, stats: Stats, rng: np.random.Generator, m: int = PROPENSITY_DRAWS
    ) -> tuple[np.ndarray, reweight.DrawSet | None]:
        """``probabilities_for``, with its draws kept when later changes can reweight them."""
        trial = trial_share_vector(self.policy, self.statuses, self.caps, self.pulls)
        p, _, draws = _drawn_probabilities(self.policy, stats, self.live, self.caps_of_live(), rng, m=m, trial=trial)
        return p, None if draws is None else reweight.keep(self.policy, self.live, stats, draws)

    def reweighted_for(self, draw_set: reweight.DrawSet, stats: Stats) -> tuple[np.ndarray, float] | None:
        """``probabilities_for`` from kept draws reweighted to ``stats``, with the weights'
        effective sample share (None: draw again)."""
        trial = trial_share_vector(self.policy, self.statuses, self.caps, self.pulls)
        out = reweight.probabilities(draw_set, self.policy, stats, self.live, self.caps_of_live(), trial)
        return None if out is None else (out[0], out[2])


def trial_share_vector(policy: PolicyConfig, statuses: list[str], caps: np.ndarray, pulls: np.ndarray) -> np.ndarray:
    """Per arm, the fixed share of a canary on trial (fewer than ``canary_min_pulls`` pulls):
    its traffic cap, at most an equal split between live arms; 0 for every other arm."""
    n_live = sum(s != RETIRED for s in statuses)
    if n_live == 0:
        return np.zeros(len(statuses))
    return np.array(
        [
            min(float(c), 1.0 / n_live) if s == CANARY and n < policy.canary_min_pulls else 0.0
            for s, c, n in zip(statuses, caps, pulls, strict=True)
        ]
    )


def selection_probabilities(
    policy: PolicyConfig,
    stats: Stats,
    live: np.ndarray,
    caps: np.ndarray,
    rng: np.random.Generator,
    *,
    x: np.ndarray | None = None,
    m: int = PROPENSITY_DRAWS,
    trial: np.ndarray | None = None,
) -> np.ndarray:
    return _probabilities(policy, stats, live, caps, rng, x=x, m=m, trial=trial)[0]


def _probabilities(
    policy: PolicyConfig,
    stats: Stats,
    live: np.ndarray,
    caps: np.ndarray,
    rng: np.random.Generator,
    *,
    x: np.ndarray | None = None,
    m: int = PROPENSITY_DRAWS,
    trial: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(selection probabilities, probability each arm is best) over all arms, from one set of
    joint draws (retired arms 0 in both)."""
    out, best, _ = _drawn_probabilities(policy, stats, live, caps, rng, x=x, m=m, trial=trial)
    return out, best


def _drawn_probabilities(
    policy: PolicyConfig,
    stats: Stats,
    live: np.ndarray,
    caps: np.ndarray,
    rng: np.random.Generator,
    *,
    x: np.ndarray | None = None,
    m: int = PROPENSITY_DRAWS,
    trial: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``_probabilities`` and the live arms' joint draws they came from (None: no live arm)."""
    idx = np.flatnonzero(live)
    out, best = np.zeros(len(live)), np.zeros(len(live))
    if not len(idx):
        return out, best, None
    live_stats = Stats(
        stats.w[idx],
        stats.s[idx],
        stats.ss[idx],
        None if stats.xtx is None else stats.xtx[idx],
        None if stats.xty is None else stats.xty[idx],
    )
    draws = posterior.draws(policy, live_stats, rng, m, x=x)
    # Thompson: capped mass goes to the arm that would win without the capped one, not pro rata.
    allocate = ids.ids_probabilities if policy.allocation == IDS else selection.thompson_probabilities
    out[idx] = allocate(draws, floor=policy.exploration_floor, caps=caps[idx])
    best[idx] = selection.action_probabilities(draws)
    if trial is not None and np.any(trial > 0):
        out = canary.trial_shares(out, trial > 0, trial)
    return out, best, draws


def build(
    *,
    row: Any,
    arms: list[Any],
    stats: Stats,
    now: datetime,
    rng: np.random.Generator,
    pulls: np.ndarray | None = None,
    reward_sums: np.ndarray | None = None,
) -> EndpointSnapshot:
    """Compute everything Select and GetEndpoint need from the stored rows (``pulls`` and
    ``reward_sums`` override the arms' own, for a snapshot with folded feedback)."""
    policy = PolicyConfig.from_json({"kind": row.policy_kind, **row.policy})
    arm_ids = [a.arm_id for a in arms]
    statuses = [a.status for a in arms]
    caps = np.array([a.traffic_cap if a.status == CANARY else 1.0 for a in arms])
    fields = _posterior_fields(
        policy,
        arm_ids,
        statuses,
        caps,
        row.incumbent_arm_id,
        stats,
        np.array([a.pulls for a in arms], dtype=float) if pulls is None else pulls,
        np.array([a.reward_sum for a in arms], dtype=float) if reward_sums is None else reward_sums,
        now,
        rng,
    )
    assert fields is not None  # drawn, not reused
    return EndpointSnapshot(
        name=row.name,
        description=row.description,
        policy=policy,
        reward_spec=row.reward_spec,
        arm_ids=arm_ids,
        params=[a.params for a in arms],
        statuses=statuses,
        caps=caps,
        stored_incumbent=row.incumbent_arm_id,
        created_at=row.created_at,
        **fields,
    )


def rebuild(
    snap: EndpointSnapshot,
    *,
    stats: Stats,
    pulls: np.ndarray,
    reward_sums: np.ndarray,
    now: datetime,
    rng: np.random.Generator,
    draws: int = PROPENSITY_DRAWS,
) -> EndpointSnapshot:
    """``snap`` with new statistics (folded feedback): the same arms and settings, its
    posterior fields computed again from ``draws`` joint posterior draws, which it keeps
    for ``reweighted`` when they are Beta draws. Cheaper than ``build``: nothing is parsed
    or copied."""
    out = _with_stats(snap, stats, pulls, reward_sums, now, rng=rng, draws=draws, keep=True)
    assert out is not None  # drawn, not reused
    return out


def reweighted(
    snap: EndpointSnapshot, *, stats: Stats, pulls: np.ndarray, reward_sums: np.ndarray, now: datetime
) -> EndpointSnapshot | None:
    """``rebuild`` without drawing: ``snap``'s kept draws reweighted to the new statistics
    (``reweight.py``). None when they cannot serve them (none kept, a policy they do not fit,
    too little effective sample size left): ``rebuild`` instead."""
    if snap.draw_set is None:
        return None
    return _with_stats(snap, stats, pulls, reward_sums, now, reuse=snap.draw_set)


def _with_stats(
    snap: EndpointSnapshot,
    stats: Stats,
    pulls: np.ndarray,
    reward_sums: np.ndarray,
    now: datetime,
    **how: Any,
) -> EndpointSnapshot | None:
    """``snap`` with its posterior fields for new statistics (``how``: ``_posterior_fields``'
    rng, draws, keep or reuse); None when reused draws cannot serve."""
    arms = (snap.arm_ids, snap.statuses, snap.caps, snap.stored_incumbent)
    fields = _posterior_fields(snap.policy, *arms, stats, pulls, reward_sums, now, **how)
    return None if fields is None else _replaced(snap, fields)


def _replaced(snap: EndpointSnapshot, fields: dict[str, Any]) -> EndpointSnapshot:
    out = dataclasses.replace(snap, **fields)
    if "params_structs" in snap.__dict__:  # the same params: keep the Structs already built
        out.__dict__["params_structs"] = snap.__dict__["params_structs"]
    return out


def _posterior_fields(
    policy: PolicyConfig,
    arm_ids: list[str],
    statuses: list[str],
    caps: np.ndarray,
    stored_incumbent: str,
    stats: Stats,
    pulls: np.ndarray,
    reward_sums: np.ndarray,
    now: datetime,
    rng: np.random.Generator | None = None,
    draws: int = PROPENSITY_DRAWS,
    *,
    keep: bool = False,
    reuse: reweight.DrawSet | None = None,
) -> dict[str, Any] | None:
    """The fields of a snapshot that depend on its statistics: from ``draws`` new joint
    draws (kept in ``draw_set`` if ``keep`` and reweightable), or from ``reuse`` reweighted
    (None if it cannot serve)."""
    live = np.array([s != RETIRED for s in statuses])
    # Linear endpoints have no context-free policy; their reported probabilities use the
    # context-free reward posterior (Gaussian over the same w, s, ss).
    shown = PolicyConfig(kind="thompson_gaussian") if policy.kind == LINEAR else policy
    trial = trial_share_vector(policy, statuses, caps, pulls)
    # One set of draws gives both the selection probabilities and the probability of being best.
    draw_set = reuse
    if reuse is not None:
        reused = reweight.probabilities(reuse, shown, stats, live, caps, trial)
        if reused is None:
            return None
        probabilities, best, ess = reused
    else:
        assert rng is not None
        probabilities, best, drawn = _drawn_probabilities(shown, stats, live, caps, rng, m=draws, trial=trial)
        draw_set = reweight.keep(shown, live, stats, drawn) if keep and drawn is not None else None
        ess = 1.0
    means, lo, hi = posterior.summaries(shown, stats)
    # Canaries are on trial: only active arms can be the incumbent.
    active = np.array([s == ACTIVE for s in statuses])
    active_ids = [a for a, ok in zip(arm_ids, active, strict=True) if ok]
    current = stored_incumbent if stored_incumbent in active_ids else None
    chosen = incumbent.choose_incumbent(
        current,
        active_ids,
        means[active],
        lo[active],
        hi[active],
        pulls[active],
        min_pulls=policy.incumbent_min_pulls,
        max_interval_width=policy.incumbent_max_interval_width,
        min_margin=policy.incumbent_min_margin,
    )
    return {
        "pulls": pulls,
        "reward_sums": reward_sums,
        "stats": stats,
        "probabilities": probabilities,
        "probability_best": best,
        "means": means,
        "ci_low": lo,
        "ci_high": hi,
        "incumbent": chosen or "",
        "as_of": now,
        "draw_set": draw_set,
        "draw_ess": ess,
    }
