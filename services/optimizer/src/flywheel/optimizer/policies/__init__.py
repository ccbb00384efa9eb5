"""Bandit math for the optimizer: pure numpy/scipy functions over sufficient statistics.

No I/O and no database here. The service keeps additive statistics per arm in PostgreSQL
(updated with SQL increments), brings them to "now" (`drift`), and calls these functions;
`bench/regret` drives the very same functions through `simulate.ThompsonAgent`, so the
benchmark measures what the service runs.

Modules:

- `beta`: Beta-Bernoulli with fractional rewards (alpha += r, beta += 1 - r).
- `gaussian`: Normal-Inverse-Gamma posterior for rewards of unknown mean and variance.
- `linear`: linear Thompson sampling over per-arm X'X and X'y.
- `drift`: exponential discounting (half-life) and sliding-window bucket sums.
- `segments`: per-segment priors that borrow from the other segments as much as they agree (empirical Bayes).
- `selection`: action probabilities from posterior draws, caps and floors, sampling.
- `incumbent`: the stability rule that names the incumbent arm.
- `canary`: probability that a canary beats the incumbent, and the verdict.
- `simulate`: an in-memory agent holding the service's statistics, for tests and benchmarks.
"""

from flywheel.optimizer.policies.summary import Summary

__all__ = ["Summary"]
