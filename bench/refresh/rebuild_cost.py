"""What a snapshot rebuild from folds costs, drawn again against reweighted, idle and under GIL contention.

    python bench/refresh/rebuild_cost.py            # ~1 min on 2 cores

A fold changes five arms of a Beta endpoint by one reward each; the snapshot is rebuilt either
by drawing 1,000 joint posterior draws again (``snapshot.rebuild``, what every fold did before
``reweight.py``) or by reweighting the draws kept from the last rebuild (``snapshot.reweighted``).
Each is timed on an idle interpreter and with one other Python thread spinning, as Select's
worker threads do under load: numpy releases the GIL around random draws and operations over
500 elements, and getting it back then waits for the spinning thread (services/optimizer/README.md,
"Reweighting instead of drawing"). It also times one 1,000 x 10 Beta draw alone, both ways. Median
ms per call (and the reweighting's mean over 300 calls, which counts those that waited a switch
interval for the GIL); writes ``bench/results/rebuild-cost.json`` (stamped) and prints it as the last line.
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from flywheel.optimizer import snapshot
from flywheel.optimizer.posterior import Stats
from flywheel.stack.benchstamp import RESULTS, write_results

NOW = datetime.now(UTC)


def _setup(k: int) -> tuple[Any, Any]:
    """(reweight, redraw) callables for a k-arm Beta endpoint after a fold of five rewards."""
    row = SimpleNamespace(
        name="e", description="", policy_kind="thompson_beta", policy={}, reward_spec={},
        incumbent_arm_id="", created_at=NOW,
    )  # fmt: skip
    arms = [
        SimpleNamespace(arm_id=f"a{i}", status="active", traffic_cap=1.0, params={}, pulls=200, reward_sum=100.0)
        for i in range(k)
    ]
    w, s = np.full(k, 200.0), 100.0 + np.linspace(0, 20, k)
    rng = np.random.default_rng(0)
    read = snapshot.build(row=row, arms=arms, stats=Stats(w, s, s.copy()), now=NOW, rng=rng)
    base = snapshot.rebuild(read, stats=Stats(w, s, s.copy()), pulls=w, reward_sums=s, now=NOW, rng=rng, draws=1000)
    w2, s2 = w.copy(), s.copy()
    w2[: min(k, 5)] += 1
    s2[: min(k, 5)] += 0.5
    st = Stats(w2, s2, s2.copy())

    def reweight() -> Any:
        return snapshot.reweighted(base, stats=st, pulls=w2, reward_sums=s2, now=NOW)

    def redraw() -> Any:
        return snapshot.rebuild(base, stats=st, pulls=w2, reward_sums=s2, now=NOW, rng=rng, draws=1000)

    if reweight() is None:
        raise RuntimeError("the kept draws should serve this fold")
    return reweight, redraw


def _median_ms(f: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return round(float(np.median(times)) * 1e3, 3)


def _mean_ms(f: Any, n: int) -> float:
    """The mean, which counts the calls that waited a switch interval for the GIL (the median hides them)."""
    t = time.perf_counter()
    for _ in range(n):
        f()
    return round((time.perf_counter() - t) / n * 1e3, 3)


def _measure(busy: bool, n_fast: int, n_slow: int) -> dict[str, Any]:
    stop = [False]  # a plain flag: the spinning thread runs bytecode only, never releasing the GIL itself

    def spin() -> None:
        x = 0
        while not stop[0]:
            x += 1

    thread = threading.Thread(target=spin, daemon=True)
    if busy:
        thread.start()
    try:
        rng = np.random.default_rng(1)
        out: dict[str, Any] = {
            "beta_draw_1000x10_ms": _median_ms(
                lambda: rng.beta(np.full(10, 50.0), np.full(10, 50.0), (1000, 10)), n_slow
            )
        }
        for k in (2, 10, 100):
            reweight, redraw = _setup(k)
            out[f"k{k}"] = {
                "reweighted_ms": _median_ms(reweight, n_fast),
                "reweighted_mean_ms": _mean_ms(reweight, 300),
                "drawn_ms": _median_ms(redraw, n_slow),
            }
        return out
    finally:
        stop[0] = True
        if busy:
            thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "rebuild-cost.json")
    args = ap.parse_args()
    figures = {"idle": _measure(False, 200, 100), "one_thread_spinning": _measure(True, 20, 10)}
    print(f"{'':26}{'k = 2':>16}{'k = 10':>16}{'k = 100':>16}")
    for state, got in figures.items():
        for how in ("reweighted_ms", "reweighted_mean_ms", "drawn_ms"):
            cells = "".join(f"{got[f'k{k}'][how]:>13.2f} ms" for k in (2, 10, 100))
            print(f"{how[:-3] + ', ' + state:<26}{cells}")
        print(f"{'one 1000x10 beta draw, ' + state:<40}{got['beta_draw_1000x10_ms']:.2f} ms")
    ratios = {
        f"drawn_vs_reweighted_k{k}_{state}": round(got[f"k{k}"]["drawn_ms"] / got[f"k{k}"]["reweighted_ms"], 1)
        for state, got in figures.items()
        for k in (2, 10, 100)
    }
    write_results(
        "rebuild-cost",
        {"params": {"draws": 1000, "changed_arms": 5}, "figures": figures, "ratios": ratios},
        out=args.out,
    )


if __name__ == "__main__":
    main()
