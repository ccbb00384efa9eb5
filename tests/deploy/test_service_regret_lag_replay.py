"""bench/service-regret/lag_replay.py: lags shift the world's delays, the paired ratio, and a tiny
replay in which a long lag costs regret (the effect the script exists to measure)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "service-regret" / "lag_replay.py"


@pytest.fixture(scope="module")
def replay():
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("service_regret_lag_replay", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for name in ("inprocess", "worlds", "envs", "loop"):  # the benches' top-level modules
            sys.modules.pop(name, None)
        sys.path[:] = saved


def test_a_lag_adds_to_the_worlds_own_delays(replay) -> None:
    world = replay.make_world("delayed", "bernoulli", 2, 0, 300, 0.1, 100)
    shifted = replay.lagged(world, 7, False, np.random.default_rng(0))
    assert (shifted.delays - world.delays == 7).all()
    jittered = replay.lagged(world, 7, True, np.random.default_rng(0)).delays - world.delays
    assert jittered.min() >= 0 and jittered.max() <= 14 and abs(jittered.mean() - 7) < 1
    assert (replay.lagged(world, 0, True, np.random.default_rng(0)).delays == world.delays).all()


def test_the_paired_ratio_and_its_interval(replay) -> None:
    ref = np.array([10.0, 20.0, 30.0, 40.0])
    same = replay.paired_ratio(ref, ref, np.random.default_rng(0))
    assert same == {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    double = replay.paired_ratio(2 * ref, ref, np.random.default_rng(0))
    assert double["ratio"] == pytest.approx(2.0) and double["ci_low"] == pytest.approx(2.0)


def test_a_long_lag_costs_regret_and_lag_zero_is_the_reference(replay) -> None:
    params = {"lags": [0, 300], "seeds": 6, "horizon": 600, "gap": 0.2, "max_delay": 0, "arms": [2]}
    figures = replay.replay({**params, "worlds": ["stationary"], "jitter": False})
    rows = {r["lag"]: r for r in figures["rows"]}
    assert rows[0]["ratio"] == 1.0
    # Half the horizon without feedback: the policy keeps splitting its traffic for 300 decisions.
    assert rows[300]["ratio"] > 1.5 and rows[300]["ci_low"] > 1.0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--lags", "abc"], "comma-separated integers"),
        (["--lags", "5,-1"], ">= 0"),
        (["--seeds", "0"], ">= 2"),
        (["--worlds", "stationary,nope"], "unknown world(s) nope"),
        (["--arms", "1"], ">= 2"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(replay, tmp_path, capsys, args, says) -> None:
    out = tmp_path / "replay.json"
    with pytest.raises(SystemExit) as exit_:
        replay.main([*args, "--out", str(out)])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert not out.exists()  # no results file that looks like a run (--seeds 0 used to write NaN ratios)
