"""Every Prometheus metric the code registers, read from the sources (no service is imported):
calls of prometheus_client's Counter, Gauge, Histogram, Summary, Info and Enum, with the name,
help text and labels they pass."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_GLOBS = ("libs/*/src/**/*.py", "services/*/src/**/*.py", "deploy/*/src/**/*.py")
KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
# Series each kind exposes, by suffix of its (counter: _total-less) name.
SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
}


@dataclass(frozen=True)
class Metric:
    name: str  # as registered (a counter's may end in _total)
    kind: str
    help: str
    labels: tuple[str, ...]
    source: str  # path:line

    @property
    def family(self) -> str:
        """The name Prometheus' client exposes the family under (a counter's without _total)."""
        return self.name.removesuffix("_total") if self.kind == "Counter" else self.name

    @property
    def series(self) -> set[str]:
        """The sample names a scrape shows."""
        return {self.family + suffix for suffix in SUFFIXES[self.kind]}


def _prometheus_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> kind, for the kinds imported from prometheus_client in this module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client":
            for alias in node.names:
                if alias.name in KINDS:
                    names[alias.asname or alias.name] = alias.name
    return names


def _kind(call: ast.Call, local: dict[str, str]) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return local.get(func.id)
    if (
        isinstance(func, ast.Attribute)
        and func.attr in KINDS
        and isinstance(func.value, ast.Name)
        and func.value.id in {"prometheus_client", "prom"}
    ):
        return func.attr
    return None


def registered_metrics(root: Path = ROOT) -> list[Metric]:
    """Every metric registration in the workspace's sources (tests excluded)."""
    found: list[Metric] = []
    for pattern in SOURCE_GLOBS:
        for path in sorted(root.glob(pattern)):
            if "/tests/" in path.as_posix():
                continue
            text = path.read_text()
            if "prometheus_client" not in text:
                continue
            tree = ast.parse(text)
            local = _prometheus_names(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or (kind := _kind(node, local)) is None:
                    continue
                where = f"{path.relative_to(root)}:{node.lineno}"
                if len(node.args) < 2 or not all(isinstance(a, ast.Constant) for a in node.args[:2]):
                    raise AssertionError(f"{where}: a metric's name and help must be literals to be checked")
                labels: tuple[str, ...] = ()
                label_node = node.args[2] if len(node.args) > 2 else None
                for kw in node.keywords:
                    if kw.arg == "labelnames":
                        label_node = kw.value
                if isinstance(label_node, ast.List | ast.Tuple):
                    labels = tuple(e.value for e in label_node.elts if isinstance(e, ast.Constant))
                found.append(Metric(node.args[0].value, kind, node.args[1].value, labels, where))
    return found


def exposed_series(metrics: list[Metric] | None = None) -> set[str]:
    """Every sample name the services expose."""
    return {s for m in (metrics if metrics is not None else registered_metrics()) for s in m.series}
