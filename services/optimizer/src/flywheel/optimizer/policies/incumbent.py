"""The Convergence's stability rule for naming an endpoint's incumbent arm.

The incumbent is what dashboards, canaries and "promote" compare against. It should not
flap between two arms whose estimates cross back and forth, so the current incumbent is
kept while it is well measured and no challenger beats it by a clear margin.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def choose_incumbent(
    current: str | None,
    arm_ids: Sequence[str],
    means: Sequence[float] | np.ndarray,
    ci_low: Sequence[float] | np.ndarray,
    ci_high: Sequence[float] | np.ndarray,
    pulls: Sequence[float] | np.ndarray,
    *,
    min_pulls: float = 10,
    max_interval_width: float = 0.2,
    min_margin: float = 0.1,
) -> str | None:
    """Keep ``current`` while it has >= min_pulls, its interval is narrower than
    max_interval_width, and no challenger with >= min_pulls beats its mean by >= min_margin.
    Otherwise return the arm with the best mean among arms with >= min_pulls (the first one
    listed on a tie, the current one if it ties for best), or None if no arm qualifies.
    """
    ids = list(arm_ids)
    mean = np.asarray(means, dtype=float)
    width = np.asarray(ci_high, dtype=float) - np.asarray(ci_low, dtype=float)
    qualified = np.asarray(pulls, dtype=float) >= min_pulls
    if not (len(ids) == mean.shape[0] == width.shape[0] == qualified.shape[0]):
        raise ValueError("arm_ids, means, ci_low, ci_high and pulls must have one entry per arm")
    if not qualified.any():
        return None
    cur = ids.index(current) if current in ids else None
    if cur is not None and qualified[cur]:
        challengers = qualified.copy()
        challengers[cur] = False
        beaten = bool(np.any(mean[challengers] >= mean[cur] + min_margin))
        if width[cur] < max_interval_width and not beaten:
            return current
    best = float(np.max(mean[qualified]))
    if cur is not None and qualified[cur] and mean[cur] == best:
        return current
    return ids[int(np.flatnonzero(qualified & (mean == best))[0])]
