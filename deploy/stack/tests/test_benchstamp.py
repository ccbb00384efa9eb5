"""flywheel.stack.benchstamp: results stamped with the current commit, the command as typed from
the repository root, and written atomically."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flywheel.stack import benchstamp


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=benchstamp.ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_root_is_the_repository() -> None:
    assert (benchstamp.ROOT / "bench").is_dir()
    assert (benchstamp.ROOT / "deploy" / "stack").is_dir()


def test_stamp_has_commit_command_date_and_machine() -> None:
    argv = [str(benchstamp.ROOT / "bench" / "ope" / "run.py"), "--quick", "--out", "out dir/a b.json"]
    out = benchstamp.stamp({"ratios": {"x": 1.0}, "machine": {"cpu": "mine", "extra": 1}}, argv=argv)
    assert out["stamp"]["commit"] == _head()
    assert isinstance(out["stamp"]["dirty"], bool)
    assert out["stamp"]["command"] == "python bench/ope/run.py --quick --out 'out dir/a b.json'"
    assert out["stamp"]["date"].endswith("+00:00")
    # the benchmark's own machine fields win; the helper's are added
    assert out["machine"]["cpu"] == "mine" and out["machine"]["extra"] == 1
    assert out["machine"]["cores"] and "python" in out["machine"]
    assert out["ratios"] == {"x": 1.0}


def test_command_outside_the_repository_is_kept_as_given() -> None:
    assert benchstamp.command_line(["/elsewhere/run.py", "-x"]) == "python /elsewhere/run.py -x"


def test_machine_records_installed_package_versions_only() -> None:
    found = benchstamp.machine(("pytest", "surely-not-an-installed-package"))
    assert found["packages"] == {"pytest": pytest.__version__}


def test_write_results_is_atomic_and_prints_the_json_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "r" / "demo.json"
    replaced: list[tuple[Path, Path]] = []
    real_replace = Path.replace

    def spy(self: Path, target: Path) -> Path:
        assert json.loads(self.read_text())["name"] == "demo"  # complete before it takes the name
        assert not Path(target).exists()
        replaced.append((self, Path(target)))
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", spy)
    written = benchstamp.write_results("demo", {"ratios": {"r": 2.0}}, out=out, argv=["bench/x/run.py"])
    assert replaced == [(out.with_suffix(".json.tmp"), out)]
    assert list(out.parent.iterdir()) == [out]  # no temporary file left behind
    on_disk = json.loads(out.read_text())
    assert on_disk == written
    assert on_disk["name"] == "demo" and on_disk["stamp"]["commit"] == _head()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == on_disk
