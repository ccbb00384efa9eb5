"""bench/service-regret/lag_replay.py: lags shift the world's delays, the paired ratio, and a tiny
replay in which a long lag costs regret (the effect the script exists to measure)."""

from __future__ import annotations

import importlib.util
import json
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


def _stage(p50: float, p90: float, p99: float) -> dict[str, float]:
    return {"p50_decisions": p50, "p90_decisions": p90, "p99_decisions": p99}


def test_a_measured_lag_follows_the_stages_quantiles(replay) -> None:
    draws = replay.quantile_sampler(_stage(10, 30, 80))(np.random.default_rng(0), 100_000)
    assert np.quantile(draws, 0.5) == pytest.approx(10, abs=0.3)
    assert np.quantile(draws, 0.9) == pytest.approx(30, abs=0.6)
    assert draws.min() >= 0 and draws.max() <= 80
    extra = replay.measured_extra({"sdk": _stage(1, 2, 3), "total": _stage(10, 30, 80)}, 5000, np.random.default_rng(1))
    assert extra.dtype == np.int64 and 9 <= np.median(extra) <= 13
    with pytest.raises(ValueError, match="do not decrease"):
        replay.quantile_sampler(_stage(10, 5, 80))
    with pytest.raises(ValueError, match="finite"):  # NaN compares false both ways: sorted() passes it
        replay.quantile_sampler(_stage(10, float("nan"), 80))


def test_measured_modes_are_replayed_beside_the_constant_lags(replay, tmp_path) -> None:
    lag_file = tmp_path / "lag.json"
    slow = {"sdk": _stage(1, 2, 3), "total": _stage(250, 300, 350)}
    fast = {"sdk": _stage(0, 0, 0), "total": _stage(0, 0, 0)}
    zero = {**fast, "fold_own": {**_stage(0, 0, 0), "count": 5}, "fold_peer": {**_stage(0, 0, 0), "count": 5}}
    # Two replicas that apply at once, but each learns the other's feedback 250+ decisions later.
    far = {**zero, "fold_peer": {**_stage(250, 300, 350), "count": 5}}
    modes = (("1rep-slow", slow), ("1rep-fast", fast), ("2rep-fast", zero), ("2rep-far", far))
    rows = [{"variant": "default", "mode": m, "stages": s} for m, s in modes]
    lag_file.write_text(json.dumps({"pooled": rows}))
    measured = replay.measured_lags(lag_file)
    assert {m: v["replicas"] for m, v in measured.items()} == {
        "1rep-slow": 1,
        "1rep-fast": 1,
        "2rep-fast": 2,
        "2rep-far": 2,
    }
    assert set(measured["2rep-far"]["stages"]) == {"sdk", "total", "fold_own", "fold_peer"}
    params = {"lags": [0], "seeds": 6, "horizon": 600, "gap": 0.2, "max_delay": 0, "arms": [2]}
    figures = replay.replay({**params, "worlds": ["stationary"], "jitter": False, "measured": measured})
    ratio = figures["mean_ratio_by_lag"]
    assert ratio["1rep-fast"] == 1.0  # a measured lag of 0 is the reference, draw for draw
    assert ratio["2rep-fast"] == 1.0  # two replicas that both see everything at once, too
    assert ratio["1rep-slow"] > 1.3
    # Half of every replica's evidence comes 250+ decisions late: it costs, less than all of it.
    assert 1.05 < ratio["2rep-far"] < ratio["1rep-slow"]


def test_two_replicas_get_each_reward_one_applied_the_other_a_hop_later(replay) -> None:
    none = _stage(0, 0, 0)
    stages = {"sdk": none, "total": none, "fold_own": none, "fold_peer": _stage(40, 40, 40)}
    extra = replay.measured_extras({"replicas": 2, "stages": stages}, 4000, np.random.default_rng(0))
    assert extra.shape == (2, 4000) and extra.dtype == np.int64
    # One replica has each reward at once, the other the hop later (median 40: quantiles 0, 40, 40, 40).
    assert (extra.min(axis=0) == 0).all() and np.median(extra.max(axis=0)) == pytest.approx(40, abs=1)
    assert 0.45 < (extra[0] < extra[1]).mean() < 0.55  # the applying replica drawn at random
    one = replay.measured_extras({"replicas": 1, "stages": stages}, 10, np.random.default_rng(0))
    assert one.shape == (1, 10) and (one == 0).all()  # one replica: no hop
    with pytest.raises(KeyError):  # a two-replica mode without the hop is not lag.py's
        replay.measured_extras({"replicas": 2, "stages": {"sdk": none, "total": none}}, 5, np.random.default_rng(0))


def test_the_deciding_replica_gets_a_provisional_fold_first_and_segments_their_own_stage(replay) -> None:
    slow, none = _stage(100, 100, 100), _stage(0, 0, 0)
    stages = {"sdk": none, "total": slow, "fold_own": none, "fold_peer": _stage(40, 40, 40)}
    early = {"provisional": {**_stage(5, 5, 5), "count": 4000}}
    mode = {"replicas": 2, "stages": {**stages, **early}, "provisional_share": 1.0}
    extra = replay.measured_extras(mode, 4000, np.random.default_rng(0))
    decider = np.arange(4000) % 2
    mine = extra[decider, np.arange(4000)]
    other = extra[1 - decider, np.arange(4000)]
    # The replica that made decision t has its reward ~5 decisions later; the other one by the commit.
    assert np.median(mine) == pytest.approx(5, abs=1) and np.median(other) >= 100
    # Half the events folded provisionally: the others wait for the commit at the decider too.
    half = replay.measured_extras({**mode, "provisional_share": 0.5}, 4000, np.random.default_rng(0))
    assert 0.4 < (half[decider, np.arange(4000)] <= 6).mean() < 0.6
    # A segmented world samples the segment's posterior: its own stage, or none when not measured.
    seg = replay.measured_extras(mode, 4000, np.random.default_rng(0), segmented=True)
    assert np.median(seg[decider, np.arange(4000)]) >= 100
    with_seg = {**mode, "stages": {**mode["stages"], "prov_segment": {**_stage(9, 9, 9), "count": 4000}}}
    seg = replay.measured_extras(with_seg, 4000, np.random.default_rng(0), segmented=True)
    assert np.median(seg[decider, np.arange(4000)]) == pytest.approx(9, abs=1)


def test_the_other_replica_gets_a_peer_fold_when_measured(replay) -> None:
    slow, none = _stage(100, 100, 100), _stage(0, 0, 0)
    stages = {"sdk": none, "total": slow, "fold_own": none, "fold_peer": _stage(40, 40, 40)}
    stages["provisional"] = {**_stage(5, 5, 5), "count": 4000}
    stages["prov_peer"] = {**_stage(8, 8, 8), "count": 4000}
    mode = {"replicas": 2, "stages": stages, "provisional_share": 1.0, "prov_peer_share": 1.0}
    extra = replay.measured_extras(mode, 4000, np.random.default_rng(0))
    decider, t = np.arange(4000) % 2, np.arange(4000)
    # The decider ~5 decisions later, the other replica ~8 (told by the decider), not by the commit.
    assert np.median(extra[decider, t]) == pytest.approx(5, abs=1)
    assert np.median(extra[1 - decider, t]) == pytest.approx(8, abs=1)
    # A quarter of the events told: the other replica waits for the commit for the rest.
    quarter = replay.measured_extras({**mode, "prov_peer_share": 0.25}, 4000, np.random.default_rng(0))
    assert 0.2 < (quarter[1 - decider, t] <= 9).mean() < 0.3
    # A segmented world uses the segment's peer stage, and none when it was not measured.
    seg = replay.measured_extras(mode, 4000, np.random.default_rng(0), segmented=True)
    assert np.median(seg[1 - decider, t]) >= 100


def test_the_decisions_sampled_before_the_publish_add_to_every_replicas_lag(replay) -> None:
    none = _stage(0, 0, 0)
    pre = {**_stage(7, 8, 9), "count": 4000, "histogram": {"6": 1000, "7": 2000, "8": 1000}}
    stages = {"sdk": none, "total": _stage(50, 50, 50), "fold_own": none, "fold_peer": none, "pre_publish": pre}
    stages["provisional"] = {**none, "count": 4000}  # folded at once after the publish
    one = replay.measured_extras(
        {"replicas": 1, "stages": stages, "provisional_share": 1.0}, 4000, np.random.default_rng(0)
    )
    # Drawn from the counts as seen: 6, 7 or 8, never below 6 (a quantile function would go to 0).
    assert set(np.unique(one)) == {6, 7, 8} and np.mean(one) == pytest.approx(7, abs=0.1)
    two = replay.measured_extras(
        {"replicas": 2, "stages": stages, "provisional_share": 1.0}, 4000, np.random.default_rng(0)
    )
    decider, t = np.arange(4000) % 2, np.arange(4000)
    assert np.median(two[decider, t]) == 7 and np.median(two[1 - decider, t]) >= 56  # the other: the commit
    # A file from before pre_publish was measured replays as before.
    old = replay.measured_extras(
        {"replicas": 1, "stages": {k: v for k, v in stages.items() if k != "pre_publish"}, "provisional_share": 1.0},
        4000,
        np.random.default_rng(0),
    )
    assert (old == 0).all()


def test_replicas_of_the_policy_are_the_policy_when_they_see_the_same(replay) -> None:
    run_replicas = sys.modules["inprocess"].run_replicas
    for name in ("stationary", "delayed", "drift", "segmented"):
        world = replay.make_world(name, "bernoulli", 10, 1, 300, 0.1, 100)
        half_life = 75.0 if name == "drift" else 0.0
        reference = replay.run_in_process(world, half_life, seed=5)
        both = run_replicas(world, half_life, 5, np.zeros((2, 300), dtype=np.int64))
        assert (both == reference).all(), name  # the same draws, the same arms
        extra = np.random.default_rng(2).integers(0, 40, size=300)
        shifted = replay.dataclasses.replace(world, delays=world.delays + extra)
        one = run_replicas(world, half_life, 5, extra[None, :])
        assert (one == replay.run_in_process(shifted, half_life, seed=5)).all(), name  # one replica: a lagged world


def test_a_file_that_is_not_lag_output_is_refused(replay, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"pooled": [{"variant": "default", "mode": "x", "stages": {}}]}')
    with pytest.raises(SystemExit) as exit_:
        replay.main(["--measured", str(bad), "--out", str(tmp_path / "o.json")])
    assert exit_.value.code == 2 and "not a lag.py results file" in capsys.readouterr().err


def _stage(p50: float, p90: float, p99: float, count: int = 100) -> dict[str, float]:
    return {"count": count, "p50_decisions": p50, "p90_decisions": p90, "p99_decisions": p99}


def test_the_floors_fold_every_reward_at_delivery_or_at_publish(replay) -> None:
    one = {
        "replicas": 1,
        "stages": {"sdk": _stage(1, 2, 3), "total": _stage(50, 90, 99), "provisional": _stage(12, 33, 67)},
        "delivered": _stage(4, 10, 25),
        "provisional_share": 0.9,
    }
    committed_only = {"replicas": 2, "stages": {"sdk": _stage(1, 2, 3), "total": _stage(50, 90, 99)}}
    found = replay.floors({"1rep": one, "2rep": committed_only})
    assert sorted(found) == ["1rep+delivered", "1rep+instant"]  # no provisional folds: no floor
    delivered, instant = found["1rep+delivered"]["stages"], found["1rep+instant"]["stages"]
    assert delivered["provisional"] == delivered["prov_segment"] == one["delivered"]
    assert "prov_peer" not in delivered  # one replica has no peer
    assert instant["provisional"]["p99_decisions"] == 0.0 and instant["total"] == one["stages"]["total"]
    assert found["1rep+instant"]["provisional_share"] == 1.0
    # Played: the instant floor's every reward has no extra lag; the delivered one's is the delivery.
    rng = np.random.default_rng(0)
    assert (replay.measured_extras(found["1rep+instant"], 2000, rng) == 0).all()
    extra = replay.measured_extras(found["1rep+delivered"], 2000, rng)
    assert extra.max() <= 25 and 3 <= np.median(extra) <= 5
