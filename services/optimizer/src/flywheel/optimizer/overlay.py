"""Provisional folds by event id, with their sum per arm kept up to date as they come and go.

A replica folds each reward of its own decisions on top of the committed counts until the
transaction that applies it commits (``provisional.py``). Under load a few hundred of them wait
at once, and every rebuild of a snapshot (``cache.py``) or a segment (``segment_cache.py``) puts
them on top of the counts: with the sums kept here that costs one step per arm, not one per
fold. An arm's sum is dropped when its last fold goes, so no rounding residue outlives them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flywheel.optimizer.stats import Increment


@dataclass(frozen=True)
class ArmSum:
    """What an arm's waiting folds add together: their summed increment and pulls."""

    arm_id: str
    inc: Increment
    pulls: int


@dataclass(slots=True)
class _Total:
    folds: int = 0
    pulls: int = 0
    w: float = 0.0
    s: float = 0.0
    ss: float = 0.0
    xtx: np.ndarray | None = None
    xty: np.ndarray | None = None

    def change(self, inc: Increment, sign: int) -> None:
        self.folds += sign
        self.pulls += sign * round(inc.w)
        self.w += sign * inc.w
        self.s += sign * inc.s
        self.ss += sign * inc.ss
        if inc.xtx is not None and inc.xty is not None:
            self.xtx = sign * inc.xtx if self.xtx is None else self.xtx + sign * inc.xtx
            self.xty = sign * inc.xty if self.xty is None else self.xty + sign * inc.xty


class Overlay:
    """Provisional folds by event id: (arm id, increment), and their sums per arm."""

    def __init__(self) -> None:
        self._folds: dict[str, tuple[str, Increment]] = {}
        self._sums: dict[str, _Total] = {}

    def __len__(self) -> int:
        return len(self._folds)

    def __bool__(self) -> bool:
        return bool(self._folds)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._folds

    def add(self, event_id: str, arm_id: str, inc: Increment) -> None:
        """Fold ``inc`` on ``arm_id`` under ``event_id`` (replacing a fold of the same id)."""
        self.pop(event_id)
        self._folds[event_id] = (arm_id, inc)
        total = self._sums.get(arm_id)
        if total is None:
            total = self._sums[arm_id] = _Total()
        total.change(inc, 1)

    def pop(self, event_id: str) -> tuple[str, Increment] | None:
        """Remove the fold of ``event_id`` (None if there is none)."""
        folded = self._folds.pop(event_id, None)
        if folded is None:
            return None
        arm_id, inc = folded
        total = self._sums[arm_id]
        if total.folds == 1:
            del self._sums[arm_id]  # its last fold: exactly nothing left
        else:
            total.change(inc, -1)
        return folded

    def sums(self) -> list[ArmSum]:
        """Per arm with folds waiting, their sum: new objects that later folds leave as they are
        (``_Total.change`` makes new arrays, never adds in place), so a worker thread may use
        them while the loop goes on folding."""
        return [ArmSum(arm_id, Increment(t.w, t.s, t.ss, t.xtx, t.xty), t.pulls) for arm_id, t in self._sums.items()]


def indexed(sums: list[ArmSum], arm_ids: list[str]) -> list[tuple[int, ArmSum]]:
    """``sums`` by the arm's index in ``arm_ids``, those of arms no longer there left out."""
    index = {a: i for i, a in enumerate(arm_ids)}
    return [(index[t.arm_id], t) for t in sums if t.arm_id in index]
