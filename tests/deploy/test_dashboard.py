"""The Grafana dashboard speaks only of metrics the code registers: every PromQL expression in
deploy/grafana/flywheel-dashboard.json is parsed by a real PromQL parser (promql-parser) and each
metric it selects must be a series some service exposes, so renaming a metric breaks this test.
The registry read from the sources is checked against prometheus_client's own registry."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from .promql import selected_metrics
from .registered_metrics import Metric, exposed_series, registered_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "flywheel-dashboard.json"
KEY_METRICS = {
    "Select rate": "flywheel_grpc_requests_total",
    "Select latency": "flywheel_grpc_request_seconds_bucket",
    "feedback lag": "flywheel_event_age_seconds_bucket",
    "dead letters": "flywheel_events_total",
    "training jobs": "flywheel_consumer_pending",
}


def _dashboard_module():
    spec = importlib.util.spec_from_file_location("flywheel_dashboard", DASHBOARD.with_name("dashboard.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def promql_expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(where, expression) for every panel target and every query variable."""
    found: list[tuple[str, str]] = []

    def panels(items: list[dict]) -> None:
        for panel in items:
            for target in panel.get("targets", []):
                found.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
            panels(panel.get("panels", []))

    panels(dashboard["panels"])
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        call = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        assert call, f"variable {var['name']}: only label_values(metric, label) is expected, got {query!r}"
        found.append((f"variable {var['name']}", call[1]))
    return found


@pytest.fixture(scope="module")
def metrics() -> list[Metric]:
    return registered_metrics()


def test_dashboard_json_is_generated_and_fresh() -> None:
    assert _dashboard_module().main(["--check"]) == 0, "run python deploy/grafana/dashboard.py"


def test_every_expression_selects_only_registered_metrics(metrics: list[Metric]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = exposed_series(metrics)
    expressions = promql_expressions(dashboard)
    assert len(expressions) >= 15
    used: set[str] = set()
    for where, expr in expressions:
        names = selected_metrics(expr)
        assert names, f"{where}: selects no metric"
        unknown = names - exposed
        assert not unknown, f"{where}: {sorted(unknown)} are not registered by any service ({expr})"
        used |= names
    for purpose, name in KEY_METRICS.items():
        assert name in used, f"the dashboard has no panel on {purpose} ({name})"


def test_labels_used_exist_on_their_metric(metrics: list[Metric]) -> None:
    """A matcher or grouping on a label the metric does not have is an empty panel."""
    by_series = {s: m for m in metrics for s in m.series}
    scrape_labels = {"namespace", "pod", "job", "instance", "service", "le"}
    for where, expr in promql_expressions(json.loads(DASHBOARD.read_text())):
        for selector in re.finditer(r"(flywheel_\w+)\{([^}]*)\}", expr):
            metric = by_series[selector[1]]
            for label in re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", selector[2]):
                assert label in (*metric.labels, *scrape_labels), f"{where}: {metric.name} has no label {label!r}"


def test_a_renamed_metric_is_caught(metrics: list[Metric]) -> None:
    exposed = exposed_series(metrics)
    good = 'sum(rate(flywheel_events_total{outcome="deadletter"}[$__rate_interval]))'
    assert selected_metrics(good) <= exposed
    renamed = good.replace("flywheel_events_total", "flywheel_event_total")
    assert selected_metrics(renamed) - exposed == {"flywheel_event_total"}
    with pytest.raises(ValueError, match="parenthesis"):  # a PromQL syntax error is not silently skipped
        selected_metrics("sum(rate(flywheel_events_total[5m])")


def test_source_scan_matches_prometheus_clients_registry(metrics: list[Metric]) -> None:
    """Importing the modules that register metrics yields exactly the families the scan found."""
    modules = {m.source.split(":")[0].split("/src/", 1)[1].removesuffix(".py").replace("/", ".") for m in metrics}
    for module in modules:
        importlib.import_module(module)
    families = {family.name for family in REGISTRY.collect() if family.name.startswith("flywheel_")}
    for metric in metrics:
        assert metric.family in families or metric.name in families, f"{metric.name} ({metric.source})"
