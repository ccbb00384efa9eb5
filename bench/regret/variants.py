"""Policy variants tried against shipped Thompson sampling, on tuning seeds (never the reported ones).

    python bench/regret/run.py --seeds 20 --seed-offset 1000 --out /tmp/regret-tuning.json
    python bench/regret/variants.py --peers /tmp/regret-tuning.json

The first command gives the peers' regrets on seeds 1000-1019; this script replays the same
environments (`envs`, `loop`) for each variant and prints, per configuration, its regret over
the best peer's (stationary) or over stationary TS's (drift), with the mean over configurations.
Only ``ids_0.1`` ships (as ``allocation: ids``); bench/README.md ("What was tried") says why
the others do not. ``--only a,b`` runs some of them; ``--no-drift`` skips the drift table.

Variants, all on `ThompsonAgent`'s statistics:
- ``ts``: plain Thompson sampling, what the service does.
- ``eps_ts``: epsilon-TS (Jin et al. 2023): each arm's draw is replaced by its posterior mean
  with probability 1 - 1/k; an arm never pulled draws +inf.
- ``tempered_c``: draws pulled toward the posterior mean, mean + c (draw - mean).
- ``discounted``: the service's half-life discounting (500 steps).
- ``ids_0.0`` / ``ids_0.1``: information-directed sampling from 1000 joint draws per batch
  (`policies.ids`), pure or with a 10% Thompson share (what ``allocation: ids`` ships);
  ``ids_discounted``: the shipped one with the 500-step half-life, under drift.
- ``detect_use`` / ``detect_reset``: stationary statistics plus a second copy discounted with a
  250-step half-life; a per-arm z-test (|z| > 3) of the recent evidence against the older
  evidence either uses the recent copy for that arm or resets the arm's statistics to it.
- ``oracle_restart`` / ``oracle_restart_ids``: not a policy anyone can run, a bound. It is told
  when the drift happens and starts again from the prior at that moment (TS, or IDS with its
  10% Thompson share): what a perfect change detector with no delay and no false alarm would
  achieve by restarting, the best any forget-and-relearn policy can do on this bench.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from envs import REWARDS, environment, make_base
from loop import play

from flywheel.optimizer.policies import gaussian
from flywheel.optimizer.policies.ids import ids_probabilities
from flywheel.optimizer.policies.selection import sample_many
from flywheel.optimizer.policies.simulate import ThompsonAgent

PEERS = ("mabwiser_ts", "mabwiser_ucb1", "mabwiser_eps_greedy", "vw_cb_explore")


class Variant:
    """Thompson sampling whose joint draws are reshaped by ``mode`` before the argmax."""

    def __init__(
        self, k: int, kind: str, seed: int, mode: str = "ts", c: float = 1.0, half_life: float = 0.0, m: int = 1000
    ) -> None:
        self.agent = ThompsonAgent(k, kind, half_life_s=half_life)  # type: ignore[arg-type]
        self.rng = np.random.default_rng(seed)
        self.mode, self.c, self.k, self.m = mode, c, k, m

    def _means(self) -> tuple[np.ndarray, np.ndarray]:
        ev = self.agent.evidence()
        if self.agent.kind == "beta":
            return (1 + ev[0]) / (2 + ev[0] + ev[1]), ev[0] + ev[1]
        return gaussian.posterior(ev[0], ev[1], ev[2], self.agent.prior).mean, ev[0]

    def select(self, n: int, now: float) -> np.ndarray:
        if self.mode == "ids":
            p = ids_probabilities(self.agent.draws(self.rng, self.m, now=now), thompson_share=self.c)
            return sample_many(p, self.rng, n)
        d = self.agent.draws(self.rng, n, now=now)
        if self.mode == "tempered":
            mean, _ = self._means()
            d = mean + self.c * (d - mean)
        elif self.mode == "eps_ts":
            mean, pulls = self._means()
            d = np.where(self.rng.random(d.shape) < 1.0 / self.k, d, mean)
            d = np.where(pulls < 1, np.inf, d) + 1e-9 * self.rng.random(d.shape)  # untried arms first, ties random
        return np.argmax(d, axis=1)

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        self.agent.update_many(arms, rewards, now=now)


class Detector:
    """Stationary TS plus a discounted copy; a per-arm z-test of recent vs older evidence."""

    def __init__(self, k: int, kind: str, seed: int, reset: bool, half_life: float = 250.0, z: float = 3.0) -> None:
        self.kind, self.reset, self.z = kind, reset, z
        self.rng = np.random.default_rng(seed)
        self.slow = ThompsonAgent(k, kind)  # type: ignore[arg-type]
        self.fast = ThompsonAgent(k, kind, half_life_s=half_life)  # type: ignore[arg-type]

    def _moments(self, ev: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.kind == "beta":
            n = ev[0] + ev[1]
            m = np.where(n > 0, ev[0] / np.maximum(n, 1e-12), 0.5)
            return n, m, np.maximum(m * (1 - m), 0.05)
        n = ev[0]
        m = np.where(n > 0, ev[1] / np.maximum(n, 1e-12), 0.0)
        v = np.where(n > 1, np.maximum(ev[2] / np.maximum(n, 1e-12) - m * m, 1e-3), 1.0)
        return n, m, v

    def changed(self, now: float) -> np.ndarray:
        recent = self.fast.evidence(now)
        older = [s - f for s, f in zip(self.slow.stats, recent, strict=True)]
        n_r, m_r, v_r = self._moments(recent)
        n_o, m_o, v_o = self._moments(older)
        z = np.abs(m_r - m_o) / np.sqrt(v_r / np.maximum(n_r, 1e-9) + v_o / np.maximum(n_o, 1e-9))
        return (z > self.z) & (n_r >= 5) & (n_o >= 5)

    def select(self, n: int, now: float) -> np.ndarray:
        d = self.slow.draws(self.rng, n)
        changed = self.changed(now)
        if changed.any():
            d[:, changed] = self.fast.draws(self.rng, n, now=now)[:, changed]
        return np.argmax(d, axis=1)

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        self.slow.update_many(arms, rewards, now=now)
        self.fast.update_many(arms, rewards, now=now)
        if self.reset:
            changed = self.changed(now)
            if changed.any():
                for s, f in zip(self.slow.stats, self.fast.evidence(now), strict=True):
                    s[changed] = f[changed]


class OracleRestart:
    """A bound, not a policy: told the drift's step, it drops everything it learned there."""

    def __init__(self, k: int, kind: str, seed: int, mode: str = "ts") -> None:
        self.make = lambda: Variant(k, kind, seed, mode=mode, c=0.1)
        self.inner = self.make()
        self.switch_at = float("inf")  # set by `regrets` from the environment
        self.restarted = False

    def select(self, n: int, now: float) -> np.ndarray:
        if now >= self.switch_at and not self.restarted:
            self.inner, self.restarted = self.make(), True
        return self.inner.select(n, now)

    def update(self, steps: np.ndarray, arms: np.ndarray, rewards: np.ndarray, now: float) -> None:
        if self.restarted:  # feedback for steps before the drift describes the old world
            keep = steps >= self.switch_at
            steps, arms, rewards = steps[keep], arms[keep], rewards[keep]
        if steps.shape[0]:
            self.inner.update(steps, arms, rewards, now)


Factory = Callable[[int, str, int], object]
STATIONARY: dict[str, Factory] = {
    "ts": lambda k, kind, s: Variant(k, kind, s),
    "eps_ts": partial(Variant, mode="eps_ts"),
    **{f"tempered_{c}": partial(Variant, mode="tempered", c=c) for c in (0.5, 0.7, 0.85)},
    **{f"ids_{c}": partial(Variant, mode="ids", c=c) for c in (0.0, 0.1)},
}
DRIFT: dict[str, Factory] = {
    "ts": lambda k, kind, s: Variant(k, kind, s),
    "discounted": lambda k, kind, s: Variant(k, kind, s, half_life=500.0),
    "detect_use": lambda k, kind, s: Detector(k, kind, s, reset=False),
    "detect_reset": lambda k, kind, s: Detector(k, kind, s, reset=True),
    "ids_discounted": lambda k, kind, s: Variant(k, kind, s, mode="ids", c=0.1, half_life=500.0),
    "oracle_restart": lambda k, kind, s: OracleRestart(k, kind, s),
    "oracle_restart_ids": lambda k, kind, s: OracleRestart(k, kind, s, mode="ids"),
}


def regrets(factory: Factory, scenario: str, arms: list[int], gaps: list[float], seeds: range, horizon: int) -> dict:
    """Mean final regret per configuration, on the environments `run.py` builds."""
    out: dict[str, list[float]] = {}
    for k in arms:
        for seed in seeds:
            base = make_base(k, seed, horizon, 100)
            for reward in REWARDS:
                for gap in gaps:
                    env = environment(base, reward, gap, scenario)
                    policy = factory(k, "beta" if reward == "bernoulli" else "gaussian", 7919 * seed + k)
                    if isinstance(policy, OracleRestart):
                        policy.switch_at = env.switch_at
                    chosen = play(policy, env, 20)  # type: ignore[arg-type]
                    out.setdefault(f"{reward}/k{k}/gap{gap}/{scenario}", []).append(float(env.regret(chosen).sum()))
    return {c: float(np.mean(v)) for c, v in out.items()}


def table(title: str, results: dict[str, dict[str, float]], base: dict[str, float], base_name: str) -> None:
    names = list(results)
    width = {n: max(14, len(n) + 2) for n in names}
    print(f"\n{title} (regret / {base_name})")
    print(f"{'configuration':34}" + "".join(f"{n:>{width[n]}}" for n in names) + f"{base_name:>16}")
    configs = list(results[names[0]])
    for c in configs:
        print(f"{c:34}" + "".join(f"{results[n][c] / base[c]:{width[n]}.2f}" for n in names) + f"{base[c]:16.1f}")
    means = {n: np.mean([results[n][c] / base[c] for c in configs]) for n in names}
    print(f"{'mean':34}" + "".join(f"{means[n]:{width[n]}.3f}" for n in names))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=Path, required=True, help="a regret.json from run.py on the same seeds")
    ap.add_argument("--only", help="comma-separated variant names to run (default: all)")
    ap.add_argument("--no-drift", action="store_true", help="skip the drift table")
    args = ap.parse_args()
    keep = set(args.only.split(",")) if args.only else None
    peers_run = json.loads(args.peers.read_text())
    p = peers_run["params"]
    seeds = range(p["seed_offset"], p["seed_offset"] + p["seeds"])
    per_config = peers_run["figures"]["per_config"]
    best_peer = {
        c: min(e["regret"][m]["mean"] for m in PEERS if m in e["regret"])
        for c, e in per_config.items()
        if c.endswith("/stationary")
    }
    chosen = {n: f for n, f in STATIONARY.items() if keep is None or n in keep or n == "ts"}
    stationary = {n: regrets(f, "stationary", p["arms"], p["gaps"], seeds, p["horizon"]) for n, f in chosen.items()}
    table("stationary", stationary, best_peer, "best peer")
    if args.no_drift:
        return 0
    chosen = {n: f for n, f in DRIFT.items() if keep is None or n in keep or n == "ts"}
    drift = {n: regrets(f, "drift", p["arms"], p["gaps"], seeds, p["horizon"]) for n, f in chosen.items()}
    table("drift", drift, drift["ts"], "stationary TS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
