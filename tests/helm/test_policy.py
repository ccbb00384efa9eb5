"""checkov's Kubernetes policy checks over the four rendered values sets (one checkov process,
started in the background by the ``rendered`` fixture): every finding is fixed, or listed with
its reason in helm/flywheel/ci/checkov-skips.yaml."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import yaml

from .chart import VALUES_DIR, load_values
from .conftest import Rendered


def test_policy_scan(rendered: Rendered) -> None:
    if rendered.checkov is None:
        pytest.skip("checkov is not installed here: `bash scripts/setup.sh` makes .tools/checkov (CI runs it)")
    out, err = rendered.checkov.communicate(timeout=300)
    assert out.strip(), err[-3000:]
    reports = json.loads(out)
    reports = reports if isinstance(reports, list) else [reports]
    assert all(r.get("summary", {}).get("parsing_errors", 0) == 0 for r in reports), err[-3000:]
    assert sum(r["summary"]["passed"] for r in reports) > 1000
    findings: dict[str, set[str]] = defaultdict(set)
    for report in reports:
        for f in report["results"]["failed_checks"]:
            values_set = f["file_path"].strip("/").split("/")[0]
            findings[f["check_id"]].add(f"{values_set}: {f['resource']}")
    skips = yaml.safe_load((VALUES_DIR / "checkov-skips.yaml").read_text())
    assert all(isinstance(reason, str) and len(reason) > 40 for reason in skips.values())
    unexplained = {check: sorted(where) for check, where in findings.items() if check not in skips}
    assert unexplained == {}
    assert sorted(set(skips) - set(findings)) == [], "a skip no longer matches a finding: drop it"
    # The NetworkPolicy skip covers only the sets that leave NetworkPolicies off.
    for where in findings.get("CKV2_K8S_6", ()):
        assert not load_values(where.split(":")[0])["networkPolicy"]["enabled"], where
