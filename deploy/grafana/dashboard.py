"""Writes deploy/grafana/flywheel-dashboard.json, the Grafana dashboard of Flywheel's key metrics
(Select rate and latency, feedback lag, dead letters, run progress, training jobs).

    python deploy/grafana/dashboard.py          # rewrite the JSON
    python deploy/grafana/dashboard.py --check  # fail if the committed JSON is stale

Every expression uses only metrics the services register (tests/deploy/test_dashboard.py checks
it against the code); series carry the `namespace` label that Prometheus' Kubernetes discovery
(the chart's ServiceMonitor) adds. docs/operations.md explains each metric.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("flywheel-dashboard.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace="$namespace"'
SELECT = '"/flywheel.api.optimizer.v1.SelectionService/Select"'
SELECT_ANY = '"/flywheel.api.optimizer.v1.SelectionService/Select(Batch)?"'
RATE = "$__rate_interval"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows below each other."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def row(self, title: str) -> None:
        self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "id": len(self.panels) + 1,
                "panels": [],
            }
        )
        self.y += 1

    def panel(
        self,
        title: str,
        targets: list[tuple[str, str]],
        *,
        unit: str = "short",
        kind: str = "timeseries",
        w: int = 8,
        h: int = 8,
        description: str = "",
    ) -> None:
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        self.panels.append(
            {
                "type": kind,
                "title": title,
                "description": description,
                "datasource": DS,
                "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
                "id": len(self.panels) + 1,
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
                if kind == "timeseries"
                else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
                "targets": [
                    {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        self.x += w
        self.row_h = max(self.row_h, h)


def quantiles(metric: str, selector: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    prefix = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{prefix}p{int(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def build() -> dict:
    """The dashboard as a dict (Grafana 10+ JSON model)."""
    lay = Layout()

    lay.row("Runtime selection (optimizer)")
    lay.panel(
        "Select rate by status",
        [
            (f"sum by (code) (rate(flywheel_grpc_requests_total{{{NS}, method=~{SELECT_ANY}}}[{RATE}]))", "{{code}}"),
        ],
        unit="reqps",
        description="Select and SelectBatch calls per second, by gRPC status (OK, INVALID_ARGUMENT, ...).",
    )
    lay.panel(
        "Select latency",
        quantiles("flywheel_grpc_request_seconds", f"{NS}, method={SELECT}"),
        unit="s",
        description="Server-side latency of Select (successful calls), 50th/95th/99th percentile.",
    )
    lay.panel(
        "Select errors (share)",
        [
            (
                f'sum(rate(flywheel_grpc_requests_total{{{NS}, method=~{SELECT_ANY}, code!="OK"}}[{RATE}]))'
                f" / sum(rate(flywheel_grpc_requests_total{{{NS}, method=~{SELECT_ANY}}}[{RATE}]))",
                "errors",
            ),
            (
                f'sum(rate(flywheel_grpc_requests_total{{{NS}, method=~{SELECT_ANY}, code="RESOURCE_EXHAUSTED"}}'
                f"[{RATE}])) / sum(rate(flywheel_grpc_requests_total{{{NS}, method=~{SELECT_ANY}}}[{RATE}]))",
                "decision log full",
            ),
        ],
        unit="percentunit",
        description="Share of Select calls not OK; RESOURCE_EXHAUSTED means the decision log is at its bound "
        "(PostgreSQL slow or away).",
    )

    lay.row("Feedback")
    lay.panel(
        "Feedback lag (event age when applied)",
        quantiles("flywheel_event_age_seconds", f'{NS}, consumer="optimizer-feedback"'),
        unit="s",
        description="Time from a feedback event's arrival in the stream to the optimizer taking it.",
    )
    lay.panel(
        "Feedback waiting",
        [
            (
                "max by (consumer) (flywheel_consumer_pending"
                f'{{{NS}, consumer=~"optimizer-feedback|trace-store-feedback"}})',
                "{{consumer}}",
            )
        ],
        description="Feedback events in the stream not yet delivered to each consumer.",
    )
    lay.panel(
        "Feedback applied",
        [
            (
                f'sum by (outcome) (rate(flywheel_events_total{{{NS}, consumer="optimizer-feedback"}}[{RATE}]))',
                "{{outcome}}",
            ),
            (f"sum(rate(flywheel_optimizer_feedback_batched_updates_total{{{NS}}}[{RATE}]))", "gRPC Update"),
        ],
        unit="ops",
        description="Feedback events acked, retried or dead-lettered per second; gRPC Update calls applied.",
    )

    lay.row("Dead letters and dependencies")
    lay.panel(
        "Dead letters by consumer",
        [
            (
                f'sum by (consumer) (increase(flywheel_events_total{{{NS}, outcome="deadletter"}}[{RATE}]))',
                "{{consumer}}",
            )
        ],
        description="Events a consumer could not process, sent to <namespace>.deadletter.<consumer> with the reason.",
    )
    lay.panel(
        "Retries by consumer",
        [
            (
                f'sum by (consumer) (rate(flywheel_events_total{{{NS}, outcome="retry"}}[{RATE}]))',
                "{{consumer}}",
            )
        ],
        unit="ops",
        description="Events handed back for redelivery (a dependency away, a handler error).",
    )
    lay.panel(
        "Dependencies down",
        [(f"sum by (dependency) (1 - flywheel_dependency_ready{{{NS}}})", "{{dependency}}")],
        description="Replicas whose last check of a dependency (postgres, nats, s3) failed.",
    )

    lay.row("Batch runs")
    lay.panel(
        "Run progress (evaluations/s)",
        [
            (
                f'sum(rate(flywheel_events_total{{{NS}, consumer="evaluator-requests", outcome="ack"}}[{RATE}]))',
                "evaluated",
            ),
            (
                f'sum(rate(flywheel_events_total{{{NS}, consumer="optimizer-evaluation-results", outcome="ack"}}'
                f"[{RATE}]))",
                "folded into runs",
            ),
            (
                f'sum(rate(flywheel_events_total{{{NS}, consumer="society-run-progress", outcome="ack"}}[{RATE}]))',
                "generations",
            ),
        ],
        unit="ops",
        description="Evaluation requests done, results folded into their runs, and generations finished "
        "(run progress events, as the society reads them).",
    )
    lay.panel(
        "Evaluation queue",
        [(f'max(flywheel_consumer_pending{{{NS}, consumer="evaluator-requests"}})', "waiting")],
        description="Evaluation requests not yet taken (the evaluators' KEDA ScaledObject scales on this lag).",
    )
    lay.panel(
        "Evaluation time",
        quantiles("flywheel_event_seconds", f'{NS}, consumer="evaluator-requests"'),
        unit="s",
        description="Time to run one evaluation request (target call and judging).",
    )

    lay.row("Training jobs")
    lay.panel(
        "Training jobs",
        [
            (
                f'sum by (outcome) (increase(flywheel_events_total{{{NS}, consumer="trainer-jobs"}}[{RATE}]))',
                "{{outcome}}",
            ),
            (f"sum(increase(flywheel_society_sao_training_jobs_total{{{NS}}}[{RATE}]))", "submitted by SAO"),
        ],
        description="Jobs finished (ack), handed back (retry: drain or failure) and given up (deadletter).",
    )
    lay.panel(
        "Training jobs waiting",
        [(f'max(flywheel_consumer_pending{{{NS}, consumer="trainer-jobs"}})', "queued")],
        description="Jobs not yet taken by a GPU worker (KEDA scales the trainer workers on this lag).",
    )
    lay.panel(
        "Training job duration",
        quantiles("flywheel_event_seconds", f'{NS}, consumer="trainer-jobs"'),
        unit="s",
        description="Time a worker spent on a job it settled.",
    )

    lay.row("Reward judge and society")
    lay.panel(
        "Judge LLM calls",
        [(f"sum by (outcome) (rate(flywheel_judge_llm_calls_total{{{NS}}}[{RATE}]))", "{{outcome}}")],
        unit="ops",
    )
    lay.panel(
        "Judge cache hit ratio",
        [
            (
                f'sum(rate(flywheel_judge_cache_total{{{NS}, result="hit"}}[{RATE}])) '
                f"/ sum(rate(flywheel_judge_cache_total{{{NS}}}[{RATE}]))",
                "hit ratio",
            ),
            (f"max by (judge) (flywheel_judge_fallback_rate{{{NS}}})", "fallback {{judge}}"),
        ],
        unit="percentunit",
    )
    lay.panel(
        "SAO pairs",
        [
            (f"sum(rate(flywheel_society_sao_pairs_kept_total{{{NS}}}[{RATE}]))", "kept"),
            (f"sum by (reason) (rate(flywheel_society_sao_pairs_dropped_total{{{NS}}}[{RATE}]))", "dropped {{reason}}"),
        ],
        unit="ops",
    )

    return {
        "title": "Flywheel",
        "uid": "flywheel-overview",
        "description": "Flywheel's key metrics: Select, feedback lag, dead letters, run progress, training jobs.",
        "tags": ["flywheel"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "namespace",
                    "label": "Namespace",
                    "type": "query",
                    "datasource": DS,
                    "definition": "label_values(flywheel_dependency_ready, namespace)",
                    "query": {"query": "label_values(flywheel_dependency_ready, namespace)", "refId": "namespace"},
                    "refresh": 2,
                    "current": {},
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "sort": 1,
                },
            ]
        },
        "panels": lay.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the dashboard JSON, or with --check report whether the committed one is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.name} is stale: run python deploy/grafana/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
