"""The provisional overlay keeps, per arm, exactly the sum of the folds still in it."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.optimizer.overlay import Overlay
from flywheel.optimizer.stats import Increment


def _inc(reward: float, features: list[float] | None = None) -> Increment:
    out = Increment()
    out.add(reward, features)
    return out


def _by_arm(overlay: Overlay) -> dict[str, tuple[float, float, float, int]]:
    return {t.arm_id: (t.inc.w, t.inc.s, t.inc.ss, t.pulls) for t in overlay.sums()}


def test_the_sums_follow_the_folds_as_they_come_and_go():
    rng = np.random.default_rng(0)
    overlay, folds = Overlay(), {}
    for step in range(2_000):
        if folds and rng.random() < 0.45:
            event_id = list(folds)[int(rng.integers(len(folds)))]
            assert overlay.pop(event_id) == folds.pop(event_id)
        else:
            arm, reward = f"a{int(rng.integers(3))}", float(rng.random())
            folds[f"e{step}"] = (arm, _inc(reward))
            overlay.add(f"e{step}", arm, folds[f"e{step}"][1])
        expected: dict[str, list[float]] = {}
        for arm, inc in folds.values():
            e = expected.setdefault(arm, [0.0, 0.0, 0.0, 0])
            e[0], e[1], e[2], e[3] = e[0] + inc.w, e[1] + inc.s, e[2] + inc.ss, e[3] + 1
        got = _by_arm(overlay)
        assert set(got) == set(expected) and len(overlay) == len(folds)
        for arm, (w, s, ss, pulls) in got.items():
            assert (w, pulls) == (expected[arm][0], expected[arm][3])
            assert s == pytest.approx(expected[arm][1], abs=1e-9) and ss == pytest.approx(expected[arm][2], abs=1e-9)


def test_an_arm_whose_last_fold_goes_leaves_nothing_behind():
    overlay = Overlay()
    overlay.add("e1", "a", _inc(0.1))
    overlay.add("e2", "a", _inc(0.7))
    overlay.add("e3", "b", _inc(1.0))
    assert overlay.pop("e1") is not None and overlay.pop("e2") is not None
    assert _by_arm(overlay) == {"b": (1.0, 1.0, 1.0, 1)}  # no residue of 0.1 + 0.7 - 0.1 - 0.7 on a
    assert overlay.pop("e2") is None and "e3" in overlay and len(overlay) == 1


def test_the_same_event_folded_again_replaces_its_fold():
    overlay = Overlay()
    overlay.add("e1", "a", _inc(1.0))
    overlay.add("e1", "b", _inc(0.0))
    assert _by_arm(overlay) == {"b": (1.0, 0.0, 0.0, 1)} and len(overlay) == 1


def test_the_sums_of_linear_folds_carry_their_features():
    overlay = Overlay()
    overlay.add("e1", "a", _inc(1.0, [1.0, 2.0]))
    overlay.add("e2", "a", _inc(0.5, [0.0, 1.0]))
    overlay.add("e3", "a", _inc(0.0, [3.0, 0.0]))
    overlay.pop("e3")
    (arm,) = overlay.sums()
    assert arm.inc.xtx.tolist() == [[1.0, 2.0], [2.0, 5.0]] and arm.inc.xty.tolist() == [1.0, 2.5]


def test_sums_taken_earlier_stay_as_they_were_while_folds_come_and_go():
    """A worker thread draws from sums taken on the loop while the loop goes on folding."""
    overlay = Overlay()
    overlay.add("e1", "a", _inc(1.0, [1.0, 2.0]))
    (taken,) = overlay.sums()
    xtx, xty = taken.inc.xtx.copy(), taken.inc.xty.copy()
    overlay.add("e2", "a", _inc(0.5, [3.0, 1.0]))
    overlay.pop("e1")
    overlay.add("e3", "a", _inc(0.0, [1.0, 1.0]))
    assert (taken.inc.w, taken.pulls) == (1.0, 1)
    np.testing.assert_array_equal(taken.inc.xtx, xtx)
    np.testing.assert_array_equal(taken.inc.xty, xty)
    (now,) = overlay.sums()
    assert now.pulls == 2 and not np.array_equal(now.inc.xtx, xtx)
