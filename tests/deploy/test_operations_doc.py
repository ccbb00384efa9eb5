"""docs/operations.md stays true to the code: every registered metric documented with its type and
labels (and nothing documented that is not registered), its PromQL parsed and naming only real
metrics, the backup tables, version tables and buckets those the services own, the NATS roles
those of flywheel.api.subjects, the KEDA streams and consumers in the catalogue, and each values
path it names present in the chart's values.yaml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from flywheel.api.subjects import ROLES, Catalogue

from .promql import selected_metrics
from .registered_metrics import exposed_series, registered_metrics

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
VALUES = ROOT / "helm" / "flywheel" / "values.yaml"
KIND_WORDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
SERVICES_WITH_DB = ("optimizer", "trace_store", "reward_judge", "society", "trainer")


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


def _table_rows(doc: str, first_cell: str) -> dict[str, list[str]]:
    """Rows of every Markdown table whose first cell matches ``first_cell``, keyed by that cell."""
    rows: dict[str, list[str]] = {}
    for line in doc.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(first_cell, cells[0]):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_registered_metric_is_documented_with_its_type_and_labels(doc: str) -> None:
    rows = _table_rows(doc, r"`flywheel_\w+`")
    metrics = registered_metrics()
    for m in metrics:
        assert m.name in rows, f"{m.name} ({m.source}) is not in a metrics table of {DOC.name}"
        kind, labels, meaning = rows[m.name][:3]
        assert kind == KIND_WORDS[m.kind], f"{m.name}: documented as {kind}, registered as {m.kind}"
        assert set(re.findall(r"`(\w+)`", labels)) == set(m.labels), f"{m.name}: labels {labels!r} vs {m.labels}"
        assert len(meaning) > 20, f"{m.name}: say what it means"
    registered = {m.name for m in metrics}
    assert set(rows) == registered, f"documented but not registered: {set(rows) - registered}"


def test_no_metric_name_in_the_text_is_unknown(doc: str) -> None:
    known = exposed_series() | {m.name for m in registered_metrics()}
    for name in set(re.findall(r"\bflywheel_[a-z_]+\b", doc)):
        if name.startswith(("flywheel_dashboard", "flywheel_api")):
            continue
        assert name in known, f"{DOC.name} names {name}, which no service registers"


def test_promql_blocks_parse_and_name_registered_metrics(doc: str) -> None:
    blocks = re.findall(r"```promql\n(.*?)```", doc, re.DOTALL)
    assert len(blocks) >= 4
    exposed = exposed_series()
    for block in blocks:
        names = selected_metrics(" ".join(block.split()))
        assert names and names <= exposed, f"unknown metrics {names - exposed} in:\n{block}"


def _tablenames(service: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "services" / service / "src").rglob("*.py"):
        found |= set(re.findall(r'__tablename__\s*=\s*"(\w+)"', path.read_text()))
    return found


def test_backup_tables_are_the_services_tables(doc: str) -> None:
    rows = _table_rows(doc, "|".join(SERVICES_WITH_DB))
    assert set(rows) == set(SERVICES_WITH_DB)
    for service in SERVICES_WITH_DB:
        tables, version = rows[service][:2]
        assert set(re.findall(r"`(\w+)`", tables)) == _tablenames(service), service
        assert version == f"`alembic_version_{service}`"
        app = (ROOT / "services" / service / "src" / "flywheel" / service / "app.py").read_text()
        assert f'NAME = "{service}"' in app and "migrations=MIGRATIONS" in app
    evaluator = (ROOT / "services/evaluator/src/flywheel/evaluator/app.py").read_text()
    assert "migrations=" not in evaluator, "the evaluator has a database now: add it to the backup table"


def test_buckets_are_the_purposes_the_code_uses(doc: str) -> None:
    purposes: set[str] = set()
    for path in ROOT.glob("services/*/src/**/*.py"):
        purposes |= set(re.findall(r'^(?:PURPOSE|BUCKET|CHECKPOINTS)\s*=\s*"([a-z-]+)"', path.read_text(), re.M))
    rows = _table_rows(doc, r"`<prefix>-[a-z-]+`")
    assert {name.removeprefix("<prefix>-") for name in rows} == purposes
    loop = re.search(r"for purpose in ([a-z -]+);", doc)
    assert loop and set(loop[1].split()) == purposes, "the mc mirror loop must copy every bucket"


def test_nats_roles_are_the_catalogues(doc: str) -> None:
    rows = _table_rows(doc, r"`[a-z_]+`")
    roles = {name: cells for name, cells in rows.items() if name in ROLES}
    assert set(roles) == set(ROLES), f"roles table misses {set(ROLES) - set(roles)}"
    for name, cells in roles.items():
        secret = cells[1]
        if ROLES[name].uses_bus and name != "product":
            assert secret == f"`{name}-password`", name
        else:
            assert secret == "-", name


def test_keda_streams_and_consumers_are_the_catalogues(doc: str) -> None:
    catalogue = Catalogue("flywheel")
    rows = _table_rows(doc, r"`<release>-(trainer-worker|evaluator)`")
    assert set(rows) == {"<release>-trainer-worker", "<release>-evaluator"}
    for cells in rows.values():
        stream = re.search(r"`<NS>_(\w+)`", cells[0])[1]
        consumer = re.search(r"`([\w-]+)`", cells[1])[1]
        assert catalogue.consumer(consumer).stream == f"FLYWHEEL_{stream}"
    listed = set(re.findall(r"`([a-z]+(?:-[a-z]+)+)`", doc.split("`consumer` is a durable consumer", 1)[1][:600]))
    assert listed == set(catalogue.consumers)


def _resolves(values: dict, path: str) -> bool:
    node = values
    for key in path.split("."):
        if key == "*" and isinstance(node, dict):
            return True
        if node == {}:  # a free-form map (a service's config: any of its settings)
            return True
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_values_paths_exist_in_the_chart(doc: str) -> None:
    if not VALUES.is_file():
        pytest.skip("helm/flywheel/values.yaml is not there yet")
    values = yaml.safe_load(VALUES.read_text())
    tops = set(values)
    paths = {
        p
        for p in re.findall(r"`([a-zA-Z][a-zA-Z0-9]*(?:\.[a-zA-Z0-9*<>]+)+)(?::[^`]*)?`", doc)
        if p.split(".")[0] in tops and "<" not in p
    }
    assert len(paths) >= 35
    missing = sorted(p for p in paths if not _resolves(values, p))
    assert not missing, f"{DOC.name} names values the chart does not have: {missing}"
