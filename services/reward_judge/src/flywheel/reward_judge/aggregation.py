"""Combining reward signals of different scales into one number.

Every signal declares its scale ``[min, max]`` (and whether lower is better, as for
latency and cost) and is normalised to [0, 1] before it is combined: summing raw
rewards of different scales, as MassGen did, lets the widest scale decide. A signal
that is absent is left out (a missing signal is not a zero). Every method returns the
normalised components with the total."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from flywheel.core.errors import InvalidArgument


class Method(StrEnum):
    WEIGHTED_MEAN = "weighted_mean"
    WEIGHTED_SUM = "weighted_sum"
    GEOMETRIC_MEAN = "geometric_mean"


@dataclass(frozen=True)
class Signal:
    """One named reward with its declared scale; ``value`` None means absent."""

    name: str
    value: float | None
    min: float = 0.0
    max: float = 1.0
    weight: float = 1.0
    lower_is_better: bool = False

    def normalised(self) -> float:
        if self.value is None:
            raise ValueError(f"{self.name} is absent")
        x = (self.value - self.min) / (self.max - self.min)
        x = min(1.0, max(0.0, x))
        return 1.0 - x if self.lower_is_better else x


@dataclass(frozen=True)
class Aggregate:
    total: float
    components: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)


def validate_signals(signals: list[Signal]) -> None:
    seen: set[str] = set()
    for s in signals:
        if not s.name:
            raise InvalidArgument("every signal needs a name")
        if s.name in seen:
            raise InvalidArgument(f"signal {s.name!r} appears twice")
        seen.add(s.name)
        if not (math.isfinite(s.min) and math.isfinite(s.max) and s.max > s.min):
            raise InvalidArgument(f"signal {s.name!r}: scale needs finite min < max, got [{s.min}, {s.max}]")
        if not (math.isfinite(s.weight) and s.weight >= 0):
            raise InvalidArgument(f"signal {s.name!r}: weight must be finite and >= 0, got {s.weight}")
        if s.value is not None and not math.isfinite(s.value):
            raise InvalidArgument(f"signal {s.name!r}: value must be finite, got {s.value}")


def aggregate(signals: list[Signal], method: Method = Method.WEIGHTED_MEAN) -> Aggregate:
    """Normalise the signals present and combine them; the total is in [0, 1] except for
    the weighted sum, which is in [0, sum of weights]. No signal present: total 0."""
    validate_signals(signals)
    present = [s for s in signals if s.value is not None and s.weight > 0]
    components = {s.name: s.normalised() for s in present}
    weights = {s.name: s.weight for s in present}
    if not present:
        return Aggregate(0.0, {}, {})
    wsum = sum(weights.values())
    if method is Method.WEIGHTED_SUM:
        total = sum(weights[n] * x for n, x in components.items())
    elif method is Method.GEOMETRIC_MEAN:
        # A zero component zeroes the product, as it should for "all must be good"; floor avoids log(0).
        total = math.exp(sum(weights[n] * math.log(max(x, 1e-9)) for n, x in components.items()) / wsum)
        total = 0.0 if any(x == 0.0 for x in components.values()) else total
    else:
        total = sum(weights[n] * x for n, x in components.items()) / wsum
    return Aggregate(total, components, weights)


def pareto_ranks(points: list[dict[str, float]]) -> list[int]:
    """Non-domination rank of each point (0 = on the front; higher is better on every
    axis). Only the axes present in both points are compared."""
    n = len(points)

    def dominates(a: dict[str, float], b: dict[str, float]) -> bool:
        axes = a.keys() & b.keys()
        return bool(axes) and all(a[k] >= b[k] for k in axes) and any(a[k] > b[k] for k in axes)

    ranks = [-1] * n
    remaining = set(range(n))
    rank = 0
    while remaining:
        front = {i for i in remaining if not any(dominates(points[j], points[i]) for j in remaining if j != i)}
        for i in front:
            ranks[i] = rank
        remaining -= front
        rank += 1
    return ranks


def latency_signal(latency_ms: float | None, *, target_ms: float, max_ms: float, weight: float = 1.0) -> Signal:
    """Latency as a signal: 1 at or under ``target_ms``, 0 at ``max_ms``, linear between."""
    return Signal("latency", latency_ms, min=target_ms, max=max_ms, weight=weight, lower_is_better=True)


def cost_signal(cost_usd: float | None, *, budget_usd: float, weight: float = 1.0) -> Signal:
    """Cost as a signal: 1 when free, 0 at the budget."""
    return Signal("cost", cost_usd, min=0.0, max=budget_usd, weight=weight, lower_is_better=True)
