"""Make Optuna's WilcoxonPruner affordable in this benchmark without changing a single p-value.

On samples of at most 13 paired differences with ties or zeros (the common case here: scores
have three decimals and a config proposed again ties exactly), ``scipy.stats.wilcoxon`` runs an
exact permutation test over all 2**n sign flips and evaluates its statistic one resample at a
time (``apply_along_axis``): ~0.3 s per ``should_prune`` call, most of a run's time. The
statistic (scipy's own ``_wilcoxon_statistic``) already works on the last axis of an n-d
array, so ``install()`` wraps ``scipy.stats.permutation_test`` to call it once on the whole
batch (``vectorized=True``); everything else (the null distribution, the comparisons, the
p-value) is scipy's code. ``check()`` compares patched and original p-values on random samples
with ties and zeros; run.py calls it at start-up and refuses to run if one differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.stats

_ORIGINAL = scipy.stats.permutation_test


def _permutation_test(data: Any, statistic: Any, *, vectorized: Any = None, **kwargs: Any) -> Any:
    if vectorized is None and kwargs.get("permutation_type") == "samples" and len(data) == 1:

        def batched(d: np.ndarray, axis: int = -1) -> Any:
            return statistic(np.moveaxis(d, axis, -1))

        return _ORIGINAL(data, batched, vectorized=True, **kwargs)
    return _ORIGINAL(data, statistic, vectorized=vectorized, **kwargs)


def install() -> None:
    """Route scipy's one-sample permutation tests through the batched statistic."""
    scipy.stats.permutation_test = _permutation_test


def uninstall() -> None:
    scipy.stats.permutation_test = _ORIGINAL


def check(samples: int = 20, seed: int = 0, max_n: int = 10) -> int:
    """Patched vs original p-values of ``wilcoxon(d, alternative="less", zero_method="zsplit")``
    (the pruner's call) on ``samples`` random vectors of 2-``max_n`` differences with ties and zeros
    (the original is slow: 150 vectors of up to 13 took 300 s on 2 loaded cores, all equal).
    Raises if any differs; returns how many were compared."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(samples):
        n = int(rng.integers(2, max_n + 1))
        d = np.round(rng.normal(rng.normal(0, 0.1), 0.2, n), 1)  # one decimal: many ties and zeros
        cases.append(d)
    got = []
    install()
    try:
        got = [scipy.stats.wilcoxon(d, alternative="less", zero_method="zsplit").pvalue for d in cases]
    finally:
        uninstall()
    want = [scipy.stats.wilcoxon(d, alternative="less", zero_method="zsplit").pvalue for d in cases]
    bad = [(d.tolist(), g, w) for d, g, w in zip(cases, got, want, strict=True) if not np.isclose(g, w, rtol=1e-12)]
    if bad:
        raise AssertionError(f"batched Wilcoxon p-values differ from scipy's on {len(bad)} samples: {bad[:3]}")
    install()
    return len(cases)
