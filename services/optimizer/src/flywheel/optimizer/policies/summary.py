"""The summary every posterior family reports: a mean and a 95% interval."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Posterior mean of an arm's reward and a 95% interval around it."""

    mean: float
    ci_low: float
    ci_high: float

    @property
    def width(self) -> float:
        """Interval width, what the incumbent rule compares with its threshold."""
        return self.ci_high - self.ci_low
