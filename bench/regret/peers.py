"""Every policy under test behind one small interface, fed identically by `loop.play`.

- ``select(n, now)``: n arms chosen from one snapshot of the policy (no learning between them).
- ``update(steps, arms, rewards, now)``: feedback that reached the policy at time ``now``.

Flywheel is `flywheel.optimizer.policies.simulate.ThompsonAgent`, the statistics and the
functions the service runs, with either allocation: Thompson sampling (the default) or
information-directed sampling (``allocation: ids``, p from 1000 joint draws per snapshot).
Peers use their public APIs with their default settings:

- MABWiser ThompsonSampling (Beta(1, 1) on binary rewards). Gaussian rewards go through
  its ``binarizer`` as ``reward > 0.5``: 0.5 is the non-best arms' mean, the threshold
  that keeps the most of the gap (knowledge the peer would not have; it favours the peer).
- MABWiser UCB1 (alpha = 1) and EpsilonGreedy (epsilon = 0.1). MABWiser gives an arm it
  has no data for an expectation of 0, so it would never try it on purpose; as in the
  textbook algorithms, each arm is played once first (in a random order), then MABWiser
  decides.
- Vowpal Wabbit ``--cb_explore k`` (epsilon-greedy, its default epsilon 0.05), one
  constant feature, cost = -reward, the logged probability of the chosen action. Its pmf
  only changes when it learns, so a batch samples n actions from one predicted pmf.
"""

from __future__ import annotations

import numpy as np

from flywheel.optimizer.policies.simulate import ThompsonAgent

# Joint draws per snapshot for IDS (the service uses 4000; 1000 keeps k = 100 affordable here).
IDS_DRAWS = 1000


class Flywheel:
    """Flywheel's policy: kind "beta" or "gaussian", allocation "thompson" or "ids", optionally discounted."""

    def __init__(self, k: int, kind: str, seed: int, half_life: float = 0.0, allocation: str = "thompson") -> None:
        self.agent = ThompsonAgent(
            k,
            kind,  # type: ignore[arg-type]
            half_life_s=half_life,
            allocation=allocation,  # type: ignore[arg-type]
            snapshot_draws=IDS_DRAWS,
        )
        self.rng = np.random.default_rng(seed)

    def select(self, n: int, now: float) -> np.ndarray:
        return self.agent.select_many(self.rng, n, now=now)

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        self.agent.update_many(arms, rewards, now=now)


class Mabwiser:
    """A MABWiser learning policy ("ts", "ucb1" or "eps_greedy") over arms 0..k-1."""

    def __init__(self, k: int, which: str, reward: str, seed: int) -> None:
        from mabwiser.mab import MAB, LearningPolicy

        if which == "ts":
            binarizer = (lambda _arm, r: r > 0.5) if reward == "gaussian" else None
            policy = LearningPolicy.ThompsonSampling(binarizer=binarizer)
        elif which == "ucb1":
            policy = LearningPolicy.UCB1()
        elif which == "eps_greedy":
            policy = LearningPolicy.EpsilonGreedy()
        else:
            raise ValueError(which)
        self.mab = MAB(list(range(k)), policy, seed=seed)
        self.mab.fit(np.array([], dtype=int), np.array([], dtype=float))  # MABWiser predicts only after fit
        rng = np.random.default_rng(seed)
        self.warmup = list(rng.permutation(k)) if which in ("ucb1", "eps_greedy") else []

    def select(self, n: int, now: float) -> np.ndarray:
        first = [int(self.warmup.pop(0)) for _ in range(min(n, len(self.warmup)))]
        rest = n - len(first)
        if rest == 0:
            return np.asarray(first, dtype=np.intp)
        chosen = np.atleast_1d(np.asarray(self.mab.predict(np.zeros((rest, 1))), dtype=np.intp))
        return np.concatenate([np.asarray(first, dtype=np.intp), chosen])

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        self.mab.partial_fit(arms, rewards)


class VowpalWabbit:
    """Vowpal Wabbit contextual bandit with epsilon-greedy exploration and a constant context."""

    def __init__(self, k: int, seed: int, horizon: int) -> None:
        import vowpalwabbit

        self.vw = vowpalwabbit.Workspace(f"--cb_explore {k} --random_seed {seed} --quiet")
        self.rng = np.random.default_rng(seed)
        self.prob = np.zeros(horizon)
        self.next_step = 0

    def select(self, n: int, now: float) -> np.ndarray:
        pmf = np.asarray(self.vw.predict("|"), dtype=float)
        pmf /= pmf.sum()
        cdf = np.cumsum(pmf)
        arms = np.minimum(np.searchsorted(cdf, self.rng.random(n), side="right"), pmf.shape[0] - 1)
        self.prob[self.next_step : self.next_step + n] = pmf[arms]
        self.next_step += n
        return arms

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        for t, a, r in zip(steps.tolist(), arms.tolist(), rewards.tolist(), strict=True):
            self.vw.learn(f"{a + 1}:{-r}:{self.prob[t]} |")

    def close(self) -> None:
        self.vw.finish()
