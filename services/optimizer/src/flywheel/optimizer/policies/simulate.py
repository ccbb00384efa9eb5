"""An in-memory Thompson-sampling agent that holds exactly the statistics the service stores.

Used by the tests and by `bench/regret`. Updates mirror the service's SQL increments:

- ``beta``: evidence (alpha - 1, beta - 1) += (r, 1 - r) with r clamped to [0, 1];
  the posterior is Beta(1 + ., 1 + .).
- ``gaussian``: (n, s, ss) += (1, r, r^2); the posterior is `gaussian.posterior` with
  the agent's `NigPrior`.
- ``linear``: (XtX, Xty) += (x x', r x); the posterior is `linear` with ``ridge``.

With ``half_life_s > 0`` each arm's evidence row carries an ``as_of`` time and is brought
to ``now`` by `drift.decay_factor` before anything is added to it or read from it (the
prior is never discounted), which is the `drift` contract the service follows.

Selection: with caps or an exploration floor, `select` does what the service does, p =
`thompson_probabilities(m joint draws, floor, caps)` then sampling from p. Without them, for
speed, it takes the argmax of a single joint posterior draw: that has exactly the
distribution p estimates (the service's p is a Monte Carlo estimate of it). With
``allocation="ids"`` p is `ids.ids_probabilities(m joint draws, floor, caps)`, as the
service computes it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from flywheel.optimizer.policies import beta as beta_family
from flywheel.optimizer.policies import gaussian, ids, linear
from flywheel.optimizer.policies.drift import decay_factor, decay_factors
from flywheel.optimizer.policies.selection import constrain, sample_many, thompson_probabilities

Kind = Literal["beta", "gaussian", "linear"]


class ThompsonAgent:
    """Thompson sampling over k arms with the service's sufficient statistics.

    Args:
        n_arms: number of arms k.
        kind: posterior family, "beta", "gaussian" or "linear".
        half_life_s: discount half-life in the units of ``now`` (seconds); <= 0 is stationary.
        exploration_floor: minimum probability of every arm (floor * k <= 1).
        caps: per-arm maximum share of traffic, or None.
        prior: NIG prior for kind "gaussian" (default `gaussian.NigPrior()`).
        dim: context dimension for kind "linear".
        ridge: ridge added to XtX for kind "linear".
        noise_scale: v in theta ~ N(A^-1 b, v^2 A^-1) for kind "linear".
        snapshot_draws: m, the joint draws used to compute p when caps or a floor apply (or for IDS).
        allocation: "thompson" or "ids" (information-directed sampling; not for kind "linear").
    """

    def __init__(
        self,
        n_arms: int,
        kind: Kind = "beta",
        *,
        half_life_s: float = 0.0,
        exploration_floor: float = 0.0,
        caps: np.ndarray | None = None,
        prior: gaussian.NigPrior | None = None,
        dim: int | None = None,
        ridge: float = 1.0,
        noise_scale: float = 1.0,
        snapshot_draws: int = 2000,
        allocation: Literal["thompson", "ids"] = "thompson",
    ) -> None:
        if n_arms < 1:
            raise ValueError("need at least one arm")
        if kind not in ("beta", "gaussian", "linear"):
            raise ValueError(f"unknown kind {kind!r}")
        if kind == "linear" and not dim:
            raise ValueError("kind 'linear' needs dim")
        if allocation not in ("thompson", "ids") or (allocation == "ids" and kind == "linear"):
            raise ValueError(f"allocation {allocation!r} is not available for kind {kind!r}")
        self.allocation = allocation
        self.k = n_arms
        self.kind: Kind = kind
        self.half_life_s = float(half_life_s)
        self.exploration_floor = float(exploration_floor)
        self.caps = None if caps is None else np.asarray(caps, dtype=float)
        self.prior = prior or gaussian.NigPrior()
        self.dim = dim or 0
        self.ridge = float(ridge)
        self.noise_scale = float(noise_scale)
        self.snapshot_draws = int(snapshot_draws)
        if self.exploration_floor or self.caps is not None:  # fail fast on impossible settings
            constrain(np.full(n_arms, 1.0 / n_arms), floor=self.exploration_floor, caps=self.caps)
        # Evidence only (priors are added when reading); leading axis = arm.
        if kind == "beta":
            self.stats: list[np.ndarray] = [np.zeros(n_arms), np.zeros(n_arms)]
        elif kind == "gaussian":
            self.stats = [np.zeros(n_arms), np.zeros(n_arms), np.zeros(n_arms)]
        else:
            self.stats = [np.zeros((n_arms, self.dim, self.dim)), np.zeros((n_arms, self.dim))]
        self.as_of = np.zeros(n_arms)
        self.clock = 0.0

    # --- reading -------------------------------------------------------------------------

    def evidence(self, now: float | None = None) -> list[np.ndarray]:
        """The evidence statistics brought to ``now`` (default: the latest update time)."""
        if self.half_life_s <= 0:
            return self.stats
        t = self.clock if now is None else now
        f = decay_factors(t - self.as_of, self.half_life_s)
        return [s * f.reshape((-1,) + (1,) * (s.ndim - 1)) for s in self.stats]

    def pulls(self, now: float | None = None) -> np.ndarray:
        """(Discounted) number of rewards per arm."""
        ev = self.evidence(now)
        if self.kind == "beta":
            return ev[0] + ev[1]
        if self.kind == "gaussian":
            return ev[0]
        return np.trace(ev[0], axis1=1, axis2=2)  # sum of |x|^2: pulls for unit-norm contexts

    def draws(
        self, rng: np.random.Generator, m: int, context: np.ndarray | None = None, *, now: float | None = None
    ) -> np.ndarray:
        """m joint posterior draws of every arm's expected reward, shape (m, k)."""
        ev = self.evidence(now)
        if self.kind == "beta":
            return beta_family.draws(beta_family.PRIOR_ALPHA + ev[0], beta_family.PRIOR_BETA + ev[1], rng, m)
        if self.kind == "gaussian":
            return gaussian.draws(ev[0], ev[1], ev[2], self.prior, rng, m)
        if context is None:
            raise ValueError("kind 'linear' needs a context")
        return linear.draws(ev[0], ev[1], context, self.ridge, rng, m, self.noise_scale)

    def probabilities(
        self, rng: np.random.Generator, context: np.ndarray | None = None, *, now: float | None = None
    ) -> np.ndarray:
        """p as the service computes it from m joint draws: Thompson (or IDS) probabilities, caps and floor applied."""
        d = self.draws(rng, self.snapshot_draws, context, now=now)
        allocate = ids.ids_probabilities if self.allocation == "ids" else thompson_probabilities
        return allocate(d, floor=self.exploration_floor, caps=self.caps)

    # --- acting --------------------------------------------------------------------------

    def _constrained(self) -> bool:
        return self.exploration_floor > 0 or self.caps is not None

    def _single_draw_suffices(self) -> bool:
        return self.allocation == "thompson" and not self._constrained()

    def select(self, rng: np.random.Generator, context: np.ndarray | None = None, *, now: float | None = None) -> int:
        """One arm by Thompson sampling (see the module docstring for the fast path)."""
        return int(self.select_many(rng, 1, context, now=now)[0])

    def select_many(
        self, rng: np.random.Generator, n: int, context: np.ndarray | None = None, *, now: float | None = None
    ) -> np.ndarray:
        """n independent selections from the same posterior snapshot (no updates between them)."""
        if self._single_draw_suffices():
            return np.argmax(self.draws(rng, n, context, now=now), axis=1)
        return sample_many(self.probabilities(rng, context, now=now), rng, n)

    def _bring_to(self, arms: np.ndarray | int, now: float) -> None:
        self.clock = max(self.clock, now)
        if self.half_life_s <= 0:
            return
        idx = np.atleast_1d(arms)
        for a in np.unique(idx):
            f = decay_factor(now - self.as_of[a], self.half_life_s)
            if f != 1.0:
                for s in self.stats:
                    s[a] *= f
            self.as_of[a] = max(self.as_of[a], now)

    def update(self, arm: int, reward: float, now: float = 0.0, context: np.ndarray | None = None) -> None:
        """Add one reward for ``arm`` observed at time ``now``."""
        self._bring_to(arm, now)
        if self.kind == "beta":
            da, db = beta_family.increments(reward)
            self.stats[0][arm] += da
            self.stats[1][arm] += db
        elif self.kind == "gaussian":
            self.stats[0][arm] += 1.0
            self.stats[1][arm] += reward
            self.stats[2][arm] += reward * reward
        else:
            if context is None:
                raise ValueError("kind 'linear' needs a context")
            x = np.asarray(context, dtype=float)
            self.stats[0][arm] += np.outer(x, x)
            self.stats[1][arm] += reward * x

    def update_many(self, arms: np.ndarray, rewards: np.ndarray, now: float = 0.0) -> None:
        """Add rewards that all arrive at ``now`` (non-contextual kinds): same as calling `update` in turn."""
        if self.kind == "linear":
            raise ValueError("update_many is for non-contextual kinds")
        arms = np.asarray(arms, dtype=np.intp)
        r = np.asarray(rewards, dtype=float)
        if arms.size == 0:
            return
        self._bring_to(arms, now)
        if self.kind == "beta":
            r = np.clip(r, 0.0, 1.0)
            np.add.at(self.stats[0], arms, r)
            np.add.at(self.stats[1], arms, 1.0 - r)
        else:
            np.add.at(self.stats[0], arms, 1.0)
            np.add.at(self.stats[1], arms, r)
            np.add.at(self.stats[2], arms, r * r)
