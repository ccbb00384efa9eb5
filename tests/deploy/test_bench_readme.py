"""bench/README.md is what bench/make_readme.py builds from the template and the results JSONs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "make_readme.py"


def _module():
    spec = importlib.util.spec_from_file_location("make_readme", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr = _module()
    (tmp_path / "results").mkdir()
    (tmp_path / "README.template.md").write_text("# B\n\n<!-- results:x -->\n")
    monkeypatch.setattr(mr, "TEMPLATE", tmp_path / "README.template.md")
    monkeypatch.setattr(mr, "README", tmp_path / "README.md")
    monkeypatch.setattr(mr, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mr, "BENCH", tmp_path)
    assert mr.main([]) == 0
    assert mr.main(["--check"]) == 0
    (tmp_path / "README.md").write_text((tmp_path / "README.md").read_text() + "hand-copied 2.53x\n")
    assert mr.main(["--check"]) == 1


def test_sections_come_from_the_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr = _module()
    monkeypatch.setattr(mr, "RESULTS", tmp_path)
    monkeypatch.setattr(mr, "BENCH", tmp_path.parent)
    result = {
        "name": "regret",
        "machine": {"cpu": "Test CPU", "cores": 3},
        "params": {"quick": True},
        "figures": {"goals_met": {"a": False}, "wall_s": 12.5},
        "ratios": {"a": 1.25, "b": 0.5},
        "goals": {"a": 0.9},
    }
    (tmp_path / "regret.json").write_text(json.dumps(result))
    text = mr.section("regret")
    assert "Unstamped (produced before stamping); Test CPU, 3 cores" in text
    assert "| `a` | 1.25 | ≤ 0.9 | **missed** |" in text
    assert "| `b` | 0.5 | | |" in text
    assert "| wall time (s) | 12.5 |" in text
    assert "a `--quick` run" in text
    result["stamp"] = {"commit": "abcdef1234567", "dirty": False, "date": "2026-01-02T03:04:05+00:00", "command": "x"}
    (tmp_path / "regret.json").write_text(json.dumps(result))
    assert "Commit `abcdef1`, 2026-01-02T03:04:05+00:00, `x`; Test CPU, 3 cores." in mr.section("regret")
    assert "No results yet" in mr.section("absent")


def test_a_broken_results_file_is_named_not_rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr = _module()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.json").write_text('{"name": "x", "ratios": ')
    monkeypatch.setattr(mr, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mr, "BENCH", tmp_path)
    with pytest.raises(SystemExit, match=r"results/x\.json is not valid JSON"):
        mr.section("x")
    (tmp_path / "results" / "x.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="holds a list"):
        mr.section("x")
