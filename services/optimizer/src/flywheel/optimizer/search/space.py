"""The search space: typed parameters, their encoding, sampling and the evolution operators.

A config is a plain dict ``{name: value}``. Numeric parameters move in a unit coordinate
``u`` in [0, 1] (log-scaled where ``log`` is set), so one mutation scale fits every range;
values are snapped to ``step`` (or to the nearest listed value) on the way out.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CATEGORICAL, DISCRETE, CONTINUOUS = "categorical", "discrete", "continuous"


@dataclass(frozen=True)
class Param:
    """One dimension. ``values`` for categorical/discrete; ``low``/``high``/``step``/``log``/``integer``
    for continuous (``integer`` returns ints: a shorthand ``type: int``)."""

    name: str
    kind: str
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 1.0
    step: float | None = None
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if self.kind in (CATEGORICAL, DISCRETE):
            if not self.values:
                raise ValueError(f"parameter {self.name!r}: needs at least one value")
        elif self.kind == CONTINUOUS:
            if not self.low < self.high:
                raise ValueError(f"parameter {self.name!r}: min must be below max ({self.low} >= {self.high})")
            if self.log and self.low <= 0:
                raise ValueError(f"parameter {self.name!r}: a log scale needs min > 0 (got {self.low})")
            if self.step is not None and not 0 < self.step <= self.high - self.low:
                raise ValueError(f"parameter {self.name!r}: step must be in (0, max - min], got {self.step}")
        else:
            raise ValueError(f"parameter {self.name!r}: unknown kind {self.kind!r}")

    # --- unit coordinate of numeric parameters ---------------------------------------------

    def to_unit(self, value: Any) -> float:
        if self.kind == DISCRETE:
            return self.values.index(value) / max(1, len(self.values) - 1)
        x = float(value)
        if self.log:
            return (math.log(x) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (x - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> Any:
        u = min(1.0, max(0.0, float(u)))
        if self.kind == DISCRETE:
            return self.values[round(u * (len(self.values) - 1))]
        if self.log:
            x = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        else:
            x = self.low + u * (self.high - self.low)
        return self.snap(x)

    def snap(self, x: float) -> Any:
        """Clip to [low, high] and round to the step grid anchored at low (ints for ``integer``)."""
        x = min(self.high, max(self.low, x))
        if self.step:
            k = round((x - self.low) / self.step)
            x = self.low + k * self.step
            if x > self.high + 1e-12:
                x -= self.step
            x = round(x, 12)
        if self.integer:
            return round(x)
        return float(x)

    def coerce(self, value: Any) -> Any:
        """The value as this parameter holds it, or ValueError saying why it does not fit."""
        if self.kind == CATEGORICAL:
            if value not in self.values:
                raise ValueError(f"parameter {self.name!r}: {value!r} is not one of {list(self.values)}")
            return self.values[self.values.index(value)]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"parameter {self.name!r}: expected a number, got {value!r}")
        if self.kind == DISCRETE:
            nearest = min(self.values, key=lambda v: abs(float(v) - float(value)))
            if not math.isclose(float(nearest), float(value), rel_tol=1e-9, abs_tol=1e-12):
                raise ValueError(f"parameter {self.name!r}: {value!r} is not one of {list(self.values)}")
            return nearest
        if not self.low - 1e-9 <= float(value) <= self.high + 1e-9:
            raise ValueError(f"parameter {self.name!r}: {value!r} is outside [{self.low}, {self.high}]")
        return self.snap(float(value))

    @property
    def width(self) -> int:
        """Columns in the surrogate's encoding."""
        return len(self.values) if self.kind == CATEGORICAL else 1


class SearchSpace:
    """An ordered set of parameters with sampling, encoding and the evolution operators."""

    def __init__(self, params: list[Param]) -> None:
        if not params:
            raise ValueError("the search space needs at least one parameter")
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError("the search space has duplicate parameter names")
        self.params = list(params)
        self.dims = sum(p.width for p in self.params)

    # --- identity ---------------------------------------------------------------------------

    def to_json(self) -> list[dict[str, Any]]:
        return [{**asdict(p), "values": list(p.values)} for p in self.params]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> SearchSpace:
        return cls([Param(**{**d, "values": tuple(d.get("values", ()))}) for d in data])

    def fingerprint(self) -> str:
        """Same parameters, same fingerprint: how earlier runs on this space are found for warm starts."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @staticmethod
    def key(config: dict[str, Any]) -> str:
        """Canonical text of a config: equal configs, equal keys."""
        return json.dumps(config, sort_keys=True, separators=(",", ":"))

    def coerce(self, config: dict[str, Any]) -> dict[str, Any]:
        """Validate an outside config (injected, warm start) and snap it onto the space."""
        extra = set(config) - {p.name for p in self.params}
        if extra:
            raise ValueError(f"unknown parameters {sorted(extra)}; the space has {[p.name for p in self.params]}")
        out = {}
        for p in self.params:
            if p.name not in config:
                raise ValueError(f"parameter {p.name!r} is missing")
            out[p.name] = p.coerce(config[p.name])
        return out

    # --- sampling and operators --------------------------------------------------------------

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        out = {}
        for p in self.params:
            if p.kind in (CATEGORICAL, DISCRETE):
                out[p.name] = p.values[int(rng.integers(len(p.values)))]
            else:
                out[p.name] = p.from_unit(rng.random())
        return out

    def crossover(self, a: dict[str, Any], b: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """Uniform crossover: each gene from either parent with probability 1/2."""
        return {p.name: (a if rng.random() < 0.5 else b)[p.name] for p in self.params}

    def mutate(self, config: dict[str, Any], rng: np.random.Generator, *, rate: float, scale: float) -> dict[str, Any]:
        """Each gene mutates with probability ``rate`` (at least one gene always does): numeric ones by
        Gaussian noise of ``scale`` times the range in the unit coordinate, snapped to the step or the
        nearest listed value, and moved by at least one grid point; categorical ones are resampled
        among the other values."""
        out = dict(config)
        chosen = [p for p in self.params if rng.random() < rate]
        if not chosen:
            chosen = [self.params[int(rng.integers(len(self.params)))]]
        for p in chosen:
            out[p.name] = self._mutate_gene(p, out[p.name], rng, scale)
        return out

    def _mutate_gene(self, p: Param, value: Any, rng: np.random.Generator, scale: float) -> Any:
        if p.kind == CATEGORICAL:
            if len(p.values) == 1:
                return value
            others = [v for v in p.values if v != value]
            return others[int(rng.integers(len(others)))]
        u = p.to_unit(value)
        noise = rng.normal(0.0, scale)
        new = p.from_unit(u + noise)
        if new != value:
            return new
        # the move snapped back onto the same grid point: take the nearest one in its direction
        direction = 1 if noise >= 0 else -1
        if p.kind == DISCRETE:
            i = p.values.index(value) + direction
            if not 0 <= i < len(p.values):
                i -= 2 * direction
            return p.values[min(len(p.values) - 1, max(0, i))]
        step = p.step or (p.high - p.low) * 1e-6
        moved = p.snap(float(value) + direction * step)
        return moved if moved != value else p.snap(float(value) - direction * step)

    def columns(self) -> list[tuple[Param, int]]:
        """Each parameter with its first column in ``encode``."""
        out, col = [], 0
        for p in self.params:
            out.append((p, col))
            col += p.width
        return out

    # --- surrogate encoding --------------------------------------------------------------------

    def encode(self, configs: list[dict[str, Any]]) -> np.ndarray:
        """Rows in [0, 1]: numeric parameters by their unit coordinate, categorical ones one-hot
        scaled by 1/sqrt(2) so two different categories are at distance 1."""
        x = np.zeros((len(configs), self.dims))
        for i, c in enumerate(configs):
            col = 0
            for p in self.params:
                if p.kind == CATEGORICAL:
                    x[i, col + p.values.index(c[p.name])] = math.sqrt(0.5)
                else:
                    x[i, col] = p.to_unit(c[p.name])
                col += p.width
        return x
