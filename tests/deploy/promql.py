"""PromQL read by a real parser (promql-parser): the metric names an expression selects."""

from __future__ import annotations

import re

import promql_parser as pql

# Grafana's variables are not PromQL: each is replaced by a value of its kind before parsing.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    # Label values may hold $namespace etc.: inside quotes, harmless to the parser.
    assert "$" not in re.sub(r'"[^"]*"', "", expr), f"an unknown Grafana variable outside a label value: {expr}"
    return expr


def selected_metrics(expr: str) -> set[str]:
    """The metric names an expression selects (ValueError on a PromQL syntax error)."""
    names: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, pql.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            assert name, f"a selector without a metric name in {expr!r}"
            names.add(name)
        elif isinstance(node, pql.MatrixSelector):
            visit(node.vector_selector)
        elif isinstance(node, pql.BinaryExpr):
            visit(node.lhs)
            visit(node.rhs)
        elif isinstance(node, pql.AggregateExpr):
            visit(node.expr)
            if node.param is not None:
                visit(node.param)
        elif isinstance(node, pql.Call):
            for arg in node.args:
                visit(arg)
        elif isinstance(node, pql.ParenExpr | pql.UnaryExpr | pql.SubqueryExpr):
            visit(node.expr)

    visit(pql.parse(_substitute(expr)))
    return names
