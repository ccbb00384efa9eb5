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


def _run_json(commit: str, benches: dict) -> dict:
    return {
        "name": "run",
        "figures": {
            "commit": commit,
            "dirty": False,
            "started": "2026-11-24T22:00:00+00:00",
            "wall_s": 600.0,
            "stopped": None,
            "benches": benches,
        },
        "stamp": {"commit": commit, "date": "2026-11-24T22:10:00+00:00", "command": "python bench/run_all.py --mode q"},
        "machine": {"cpu": "Test CPU", "cores": 2},
    }


def _module_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """make_readme with its bench root at ``tmp_path`` and an empty ``results`` folder there."""
    mr = _module()
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(mr, "RESULTS", results)
    monkeypatch.setattr(mr, "BENCH", tmp_path)
    return mr, results


def test_this_run_says_which_jsons_carry_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr, results = _module_on(tmp_path, monkeypatch)
    run, old = "a" * 40, "b" * 40
    (results / "run.json").write_text(
        json.dumps(
            _run_json(
                run,
                {
                    "ope": {"mode": "quick", "status": "ok", "rc": 0, "wall_s": 61.0},
                    "regret": {"mode": "full", "status": "failed", "rc": 1, "wall_s": 30.0},
                    "judge": {"mode": "quick", "status": "ok", "rc": 0, "wall_s": 90.0},
                    "select": {"mode": "quick", "status": "skipped", "reason": "peers not installed: mabwiser"},
                    "sao": {"mode": "quick", "status": "not run", "reason": "HEAD moved"},
                },
            )
        )
    )
    (results / "ope.json").write_text(json.dumps({"name": "ope", "stamp": {"commit": run}}))
    (results / "regret.json").write_text(json.dumps({"name": "regret", "stamp": {"commit": old}}))
    (results / "judge.json").write_text(json.dumps({"name": "judge"}))
    text = mr.run_section()
    assert "Commit `aaaaaaa`, started 2026-11-24T22:00:00+00:00, 10.0 min in all" in text
    assert "`python bench/run_all.py --mode q`; Test CPU, 2 cores." in text
    assert "| ope | quick | ok | 0 | 1.0 min | same commit |" in text
    assert "| regret | full | failed | 1 | 0.5 min | another commit: `bbbbbbb` |" in text
    assert "| judge | quick | ok | 0 | 1.5 min | unstamped |" in text
    assert "| select | quick | skipped: peers not installed: mabwiser |  |  | missing |" in text
    assert "| sao | quick | not run: HEAD moved |  |  | missing |" in text
    # The marker in a template becomes that block, and --check sees a change in run.json.
    (tmp_path / "README.template.md").write_text("# B\n\n## This run\n\n<!-- run -->\n")
    monkeypatch.setattr(mr, "TEMPLATE", tmp_path / "README.template.md")
    monkeypatch.setattr(mr, "README", tmp_path / "README.md")
    assert mr.main([]) == 0
    assert "| ope | quick | ok | 0 | 1.0 min | same commit |" in (tmp_path / "README.md").read_text()
    (results / "ope.json").write_text(json.dumps({"name": "ope", "stamp": {"commit": old}}))
    assert mr.main(["--check"]) == 1


def test_a_missing_or_broken_run_json_is_a_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr, results = _module_on(tmp_path, monkeypatch)
    text = mr.run_section()
    assert text.startswith("_No run of every benchmark recorded yet: `")
    assert text.endswith("/results/run.json` is not there (`python bench/run_all.py` writes it)._")
    (results / "run.json").write_text(json.dumps({"name": "run", "figures": {}}))
    with pytest.raises(SystemExit, match=r"results/run\.json lacks figures\.commit"):
        mr.run_section()
    (results / "run.json").write_text("{")
    with pytest.raises(SystemExit, match=r"results/run\.json is not valid JSON"):
        mr.run_section()


def test_the_template_has_the_run_marker() -> None:
    assert "\n<!-- run -->\n" in (ROOT / "bench" / "README.template.md").read_text()


def test_a_json_rerun_in_another_mode_after_its_wave_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mr = _module()
    monkeypatch.setattr(mr, "RESULTS", tmp_path)
    monkeypatch.setattr(mr, "BENCH", tmp_path.parent)
    for name, command in (("a", "python bench/a/run.py --out x.json"), ("b", "python bench/b/run.py --quick")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"stamp": {"command": command}}))
    assert mr.shown_mode("a", {"mode": "quick"}) == "quick; its JSON: a full run"
    assert mr.shown_mode("b", {"mode": "quick"}) == "quick"
    assert mr.shown_mode("b", {"mode": "full"}) == "full; its JSON: a quick run"
    assert mr.shown_mode("a", {"mode": "smoke"}) == "smoke"  # a named mode: no guess
    assert mr.shown_mode("missing", {"mode": "full"}) == "full"
