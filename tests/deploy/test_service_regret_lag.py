"""bench/service-regret/lag.py's arithmetic: the stage histograms parsed from a scrape (the
consumer's stages and the folds'), their quantiles between two scrapes (PromQL's interpolation),
pooling, and the --variant and --replicas syntax."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "service-regret" / "lag.py"


@pytest.fixture(scope="module")
def lag():
    saved, loaded = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("service_regret_lag", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["service_regret_lag"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for name in set(sys.modules) - loaded:  # the bench's own top-level modules (service, worlds, ...)
            if name in ("service_regret_lag", "service", "worlds", "envs"):
                sys.modules.pop(name, None)
        sys.path[:] = saved


def scrape(counts: dict[str, dict[str, float]]) -> str:
    lines = ['flywheel_event_lag_seconds_bucket{consumer="other",le="+Inf",stage="handle"} 99.0']
    for stage, buckets in counts.items():
        for le, n in buckets.items():
            labels = f'consumer="optimizer-feedback",le="{le}",stage="{stage}"'
            lines.append(f"flywheel_event_lag_seconds_bucket{{{labels}}} {n}")
    return "\n".join(lines) + "\n"


def test_quantiles_come_from_the_counts_between_two_scrapes(lag) -> None:
    before = lag.buckets(scrape({"handle": {"0.01": 5, "0.02": 5, "+Inf": 5}}), "handle")
    after = lag.buckets(scrape({"handle": {"0.01": 5, "0.02": 15, "+Inf": 25}}), "handle")
    assert after == {0.01: 5.0, 0.02: 15.0, float("inf"): 25.0}  # the other consumer's sample left out
    # 20 new events: 10 in (0.01, 0.02], 10 above 0.02. The median is the top of the second bucket.
    assert lag.histogram_quantile(0.5, before, after) == pytest.approx(0.02)
    assert lag.histogram_quantile(0.25, before, after) == pytest.approx(0.015)
    assert lag.histogram_quantile(0.99, before, after) == pytest.approx(0.02)  # in +Inf: the last bound
    assert lag.histogram_quantile(0.5, after, after) is None  # nothing between the scrapes


def test_runs_pool_into_one_summary(lag) -> None:
    a = lag.Raw(sdk=[0.001, 0.003], stages={"busy": {0.01: 2.0, float("inf"): 2.0}}, rates=[100.0])
    b = lag.Raw(sdk=[0.002], stages={"busy": {0.01: 0.0, float("inf"): 2.0}}, rates=[300.0])
    a.add(b)
    summary = a.summary()
    assert summary["busy"]["count"] == 4 and summary["sdk"]["count"] == 3
    assert summary["busy"]["p50_ms"] == pytest.approx(10.0)  # 2 of 4 at or under 10 ms
    assert summary["sdk"]["p50_ms"] == pytest.approx(2.0)
    assert summary["sdk"]["p50_decisions"] == pytest.approx(0.4)  # 2 ms at the mean rate, 200/s


def test_a_variant_names_optimizer_settings(lag) -> None:
    assert lag.variant("on:feedback_prefetch=true, FEEDBACK_MAX_BATCHES=2") == (
        "on",
        {"FLYWHEEL_OPTIMIZER_FEEDBACK_PREFETCH": "true", "FLYWHEEL_OPTIMIZER_FEEDBACK_MAX_BATCHES": "2"},
    )
    assert lag.variant("plain") == ("plain", {})
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        lag.variant("x:FEEDBACK_PREFETCH")
    with pytest.raises(argparse.ArgumentTypeError, match="name"):
        lag.variant(":A=1")


def test_the_fold_stages_come_from_the_fold_lag_histogram_by_source(lag) -> None:
    text = scrape({"handle": {"0.01": 3, "+Inf": 3}}) + "".join(
        f'flywheel_optimizer_posterior_fold_lag_seconds_bucket{{le="{le}",source="{source}"}} {n}\n'
        for source, counts in (("own", {"0.005": 4, "+Inf": 6}), ("peer", {"0.005": 1, "+Inf": 2}))
        for le, n in counts.items()
    )
    assert lag.buckets(text, "fold_own") == {0.005: 4.0, float("inf"): 6.0}
    assert lag.buckets(text, "fold_peer") == {0.005: 1.0, float("inf"): 2.0}
    assert lag.buckets(text, "handle") == {0.01: 3.0, float("inf"): 3.0}  # the fold lines left out
    assert lag.minus({0.005: 4.0, float("inf"): 6.0}, {0.005: 1.0}) == {0.005: 3.0, float("inf"): 6.0}


def test_replicas_are_one_two_or_both(lag, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["lag.py", "--replicas", "3"])
    with pytest.raises(SystemExit) as exit_:
        lag.main()
    assert exit_.value.code == 2 and "--replicas: 1, 2 or 1,2" in capsys.readouterr().err


def test_tapped_latencies_pool_into_their_own_stage(lag) -> None:
    a = lag.Raw(sdk=[0.004], tapped=[0.001, 0.003], rates=[100.0])
    a.add(lag.Raw(sdk=[0.004], tapped=[0.002], rates=[300.0]))
    summary = a.summary()
    assert summary["tapped"]["count"] == 3
    assert summary["tapped"]["p50_ms"] == pytest.approx(2.0)
    assert summary["tapped"]["p50_decisions"] == pytest.approx(0.4)  # 2 ms at the mean rate, 200/s
    assert "tapped" not in lag.Raw(sdk=[0.004], rates=[100.0]).summary()  # only with --tap


def test_the_table_shows_each_process_cpu(lag) -> None:
    rows = [
        {
            "variant": "default",
            "mode": "1rep-unpaced",
            "rate": 420.0,
            "stages": {},
            "cpu_cores": {"optimizer0": 0.77, "product": 0.44, "nats": 0.12, "postgres": 0.06},
        }
    ]
    assert "cpu cores: optimizer0 0.77, product 0.44, nats 0.12, postgres 0.06" in lag.table(rows)


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_the_tap_times_each_published_feedback_from_its_meta_time(lag, servers, nats_client) -> None:
    """tap.py as lag.py runs it (a process of its own, the admin user from the environment):
    an event published now arrives within a second; one stamped 2 s ago reads about 2 s."""
    from types import SimpleNamespace

    from flywheel.api.common.v1.common_pb2 import EventMeta
    from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent

    tap = lag.Tap(SimpleNamespace(servers=servers))
    try:
        for age_s in (0.0, 2.0):
            event = FeedbackEvent(meta=EventMeta(event_id=f"e{age_s}"), decision_id="d", reward=1.0)
            event.meta.time.FromNanoseconds(int((time.time() - age_s) * 1e9))
            await nats_client.publish(f"{lag.NAMESPACE}.product.feedback.ep", event.SerializeToString())
        await nats_client.publish(f"{lag.NAMESPACE}.product.other.ep", b"not a feedback subject")
        await nats_client.flush()
        await asyncio.sleep(0.5)
    finally:
        seconds = tap.stop()
    assert len(seconds) == 2
    assert 0.0 <= seconds[0] < 1.0
    assert 2.0 <= seconds[1] < 3.0
