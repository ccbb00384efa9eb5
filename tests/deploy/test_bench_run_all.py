"""bench/run_all.py on a fake bench root in a temporary git repository: two tiny benches (one
fails), the manifest it writes, the dirty-tree refusal, the budget planner."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "run_all.py"

# A bench that writes a stamped JSON with the repo's HEAD to --out, or fails when told to.
FAKE = """
import argparse, json, subprocess, sys
from pathlib import Path
p = argparse.ArgumentParser()
p.add_argument("--quick", action="store_true")
p.add_argument("--fail", action="store_true")
p.add_argument("--out", type=Path, required=True)
a = p.parse_args()
print("running", "quick" if a.quick else "full")
if a.fail:
    print("boom", file=sys.stderr)
    sys.exit(7)
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
from flywheel.stack.benchstamp import code_inputs
stamp = {"commit": commit, "inputs": code_inputs(root=Path.cwd())}
a.out.write_text(json.dumps({"name": "x", "params": {"quick": a.quick}, "stamp": stamp}))
"""


def _module():
    spec = importlib.util.spec_from_file_location("run_all", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(module, repo, bench root, results dir) with benches ``good`` and ``bad`` committed."""
    ra = _module()
    repo = tmp_path / "repo"
    for name in ("good", "bad"):
        (repo / "bench" / name).mkdir(parents=True)
        (repo / "bench" / name / "run.py").write_text(FAKE)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "benches")
    benches = [
        ra.Bench("good", "good/run.py", {"quick": ra.Mode(("--quick",), 1), "full": ra.Mode((), 5)}),
        ra.Bench("bad", "bad/run.py", {"quick": ra.Mode(("--fail",), 1), "full": ra.Mode(("--fail",), 2)}),
        ra.Bench("peerless", "good/run.py", {"quick": ra.Mode((), 1), "full": ra.Mode((), 1)}, peers=("no-such-dist",)),
    ]
    monkeypatch.setattr(ra, "BENCHES", benches)
    return ra, repo, repo / "bench", tmp_path / "results"


def _args(root: Path, results: Path, *extra: str) -> list[str]:
    return ["--bench-root", str(root), "--results-dir", str(results), "--python", sys.executable, *extra]


def test_a_run_writes_logs_and_a_manifest(fake, capsys: pytest.CaptureFixture[str]) -> None:
    ra, repo, root, results = fake
    assert ra.main(_args(root, results, "--mode", "quick")) == 1  # "bad" failed, the run went on
    manifest = json.loads((results / "run.json").read_text())
    figures = manifest["figures"]
    assert figures["commit"] == _git(repo, "rev-parse", "HEAD")
    assert figures["dirty"] is False
    assert figures["failed"] == ["bad"]
    good, bad, peerless = (figures["benches"][n] for n in ("good", "bad", "peerless"))
    assert good["mode"] == "quick"
    assert good["status"] == "ok"
    assert good["rc"] == 0
    assert good["results_commit"] == figures["commit"]
    assert good["written"] is True
    assert good["command"].endswith(f"good/run.py --quick --out {results / 'good.json'}")
    assert bad["status"] == "failed"
    assert bad["rc"] == 7
    assert bad["written"] is False
    assert peerless["status"] == "skipped"
    assert "no-such-dist" in peerless["reason"]
    assert "--group bench" in peerless["reason"]  # no bench/good/requirements.txt: the hint names one that exists
    assert "running quick" in (results / "logs" / "good.log").read_text()
    assert "boom" in (results / "logs" / "bad.log").read_text()
    assert "stamp" in manifest  # written through benchstamp
    out = capsys.readouterr().out
    assert "good: ok, rc 0" in out
    assert "bad: failed, rc 7" in out


def test_a_dirty_tree_is_refused(fake, capsys: pytest.CaptureFixture[str]) -> None:
    ra, _repo, root, results = fake
    (root / "good" / "run.py").write_text(FAKE + "\n# edited\n")
    assert ra.main(_args(root, results, "--only", "good")) == 2
    assert "bench/good/run.py" in capsys.readouterr().err
    assert not (results / "run.json").exists()
    assert ra.main(_args(root, results, "--only", "good", "--allow-dirty")) == 0
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert figures["dirty"] is True
    assert figures["benches"]["good"]["mode"] == "full"


def test_a_timeout_is_recorded(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    ra, _repo, root, results = fake
    slow = ra.Bench("slow", "good/run.py", {"quick": ra.Mode(("--quick",), 1), "full": ra.Mode((), 1)})
    monkeypatch.setattr(ra, "BENCHES", [slow])
    monkeypatch.setattr(ra, "KILL_GRACE_S", 1)
    (root / "good" / "run.py").write_text("import time\ntime.sleep(60)\n")
    assert ra.main(_args(root, results, "--allow-dirty", "--timeout-min", "0.02")) == 1
    rec = json.loads((results / "run.json").read_text())["figures"]["benches"]["slow"]
    assert rec["status"] == "timeout"
    assert rec["wall_s"] < 30


def test_head_moving_stops_the_run(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    ra, _repo, root, results = fake
    # The first bench commits: the second must not run at the new commit.
    mover = root / "mover.py"
    mover.write_text(
        "import subprocess\n"
        "subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '--allow-empty',"
        " '-m', 'moved'], check=True)\n"
    )
    moves = ra.Bench("moves", "mover.py", {"quick": ra.Mode((), 1), "full": ra.Mode((), 1)})
    monkeypatch.setattr(ra, "BENCHES", [moves, ra.BENCHES[0]])
    assert ra.main(_args(root, results, "--allow-dirty")) == 3
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert "HEAD moved" in figures["stopped"]
    assert figures["benches"]["moves"]["head_moved"] is True
    assert figures["benches"]["good"]["status"] == "not run"


def test_the_budget_picks_full_where_it_fits() -> None:
    ra = _module()
    benches = [
        ra.Bench("a", "a/run.py", {"quick": ra.Mode((), 1), "full": ra.Mode((), 3)}),
        ra.Bench("b", "b/run.py", {"quick": ra.Mode((), 2), "full": ra.Mode((), 20)}),
        ra.Bench("c", "c/run.py", {"smoke": ra.Mode((), 4), "quick": ra.Mode((), 10), "full": ra.Mode((), 40)}),
        ra.Bench("g", "g/run.py", {"quick": ra.Mode((), 1), "full": ra.Mode((), 2, gpu=True)}),
    ]

    def modes(budget: float, **kw) -> dict[str, str]:
        kw.setdefault("overrides", {})
        items = ra.plan(benches, mode="full", budget_min=budget, have=set(), cuda=False, **kw)
        return {p.bench.name: p.mode for p in items}

    assert modes(16) == {"a": "full", "b": "quick", "c": "quick", "g": "quick"}
    assert modes(35) == {"a": "full", "b": "full", "c": "quick", "g": "quick"}
    assert modes(5) == {"a": "quick", "b": "quick", "c": "smoke", "g": "quick"}  # still over: cheapest
    assert modes(100, overrides={"a": "quick"})["a"] == "quick"
    plain = ra.plan(benches, mode="full", overrides={}, budget_min=None, have=set(), cuda=False)
    assert [p.mode for p in plain] == ["full", "full", "full", "quick"]  # no CUDA: g falls back
    forced = ra.plan(benches, mode="quick", overrides={"g": "full"}, budget_min=None, have=set(), cuda=False)
    assert "CUDA" in forced[3].skip


def test_a_skipped_bench_names_an_install_command_that_exists(tmp_path: Path) -> None:
    ra = _module()
    (tmp_path / "bench" / "own").mkdir(parents=True)
    (tmp_path / "bench" / "own" / "requirements.txt").write_text("no-such-dist\n")
    benches = [
        ra.Bench(name, f"{name}/run.py", {"quick": ra.Mode((), 1)}, peers=("no-such-dist",)) for name in ("own", "none")
    ]
    own, none = ra.plan(
        benches, mode="quick", overrides={}, budget_min=None, have=set(), cuda=False, bench_root=tmp_path / "bench"
    )
    assert own.skip.endswith("(pip install -r bench/own/requirements.txt)")
    assert "--group bench" in none.skip  # no bench/none/requirements.txt: the pyproject's group


def test_bad_arguments_name_the_flag(fake) -> None:
    ra, _repo, root, results = fake
    with pytest.raises(SystemExit, match="--only: unknown bench nope"):
        ra.main(_args(root, results, "--only", "nope"))
    with pytest.raises(SystemExit, match="--mode-for 'good=huge'"):
        ra.main(_args(root, results, "--mode-for", "good=huge"))


def test_the_real_table_points_at_real_scripts() -> None:
    ra = _module()
    for bench in ra.BENCHES:
        assert (ROOT / "bench" / bench.script).is_file(), bench.name
        assert {"quick", "full"} <= set(bench.modes), bench.name


def test_ctrl_c_still_writes_the_manifest(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    ra, _repo, root, results = fake

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ra, "run_one", interrupted)
    assert ra.main(_args(root, results, "--only", "good,bad")) == 130
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert figures["benches"]["good"]["status"] == "interrupted"
    assert figures["benches"]["bad"]["status"] == "not run"
    assert figures["stopped"] == "interrupted (Ctrl-C) during good"


def _commit(repo: Path, path: Path, message: str) -> None:
    path.write_text(path.read_text() + f"\n# {message}\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)


def test_a_run_in_waves_keeps_a_bench_only_while_its_code_is_unchanged(fake) -> None:
    ra, repo, root, results = fake
    assert ra.main(_args(root, results, "--only", "good", "--mode", "quick")) == 0
    first = _git(repo, "rev-parse", "HEAD")
    assert ra.main(_args(root, results, "--only", "bad", "--mode", "full", "--append")) == 1
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert figures["benches"]["good"]["status"] == "ok"  # kept from the first wave
    assert figures["benches"]["bad"]["status"] == "failed"
    assert figures["failed"] == ["bad"]
    assert [w["benches"] for w in figures["waves"]] == [["good"], ["bad"]]
    assert figures["wall_s"] == pytest.approx(sum(w["wall_s"] for w in figures["waves"]), abs=0.2)

    # Another commit that leaves good's code alone: a wave there keeps good's figures, which
    # now stand for the new commit, and says where they were measured.
    _commit(repo, root / "bad" / "run.py", "bad changed")
    second = _git(repo, "rev-parse", "HEAD")
    assert ra.main(_args(root, results, "--only", "peerless", "--mode", "quick", "--append")) == 1  # bad: failed
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert figures["commit"] == second
    good = figures["benches"]["good"]
    assert good["status"] == "ok" and good["carried_from"] == first and good["results_same_code"] is True
    assert [w["commit"] for w in figures["waves"]] == [first, first, second]

    # A commit that changes good's own code: its figures no longer stand for the run's commit.
    _commit(repo, root / "good" / "run.py", "good changed")
    assert ra.main(_args(root, results, "--only", "peerless", "--mode", "quick", "--append")) == 1
    good = json.loads((results / "run.json").read_text())["figures"]["benches"]["good"]
    assert good["status"] == "stale" and "its code changed since" in good["reason"]
    assert good["results_same_code"] is False

    # Rerun, it is the run's own again.
    assert ra.main(_args(root, results, "--only", "good", "--mode", "quick", "--append")) == 1
    good = json.loads((results / "run.json").read_text())["figures"]["benches"]["good"]
    assert good["status"] == "ok" and good["results_same_code"] is True


def test_results_written_in_the_repo_do_not_make_the_next_bench_dirty(fake) -> None:
    ra, repo, root, _results = fake
    results = repo / "bench" / "results"
    results.mkdir()
    (results / "good.json").write_text("{}")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a committed result")
    # The run rewrites bench/results/good.json; a second wave still counts as a clean tree.
    assert ra.main(_args(root, results, "--only", "good", "--mode", "quick")) == 0
    assert _git(repo, "status", "--porcelain")  # the result did change a tracked file
    assert ra.main(_args(root, results, "--only", "good", "--mode", "full", "--append")) == 0
    figures = json.loads((results / "run.json").read_text())["figures"]
    assert figures["dirty"] is False
    assert ra.dirty_files(repo) == ["bench/results/good.json"]  # without the results folder it would count


@pytest.mark.parametrize("manifest", ["not json", '{"figures": "nope"}', '{"figures": {"benches": []}}', "[]"])
def test_append_to_something_that_is_not_a_manifest_is_refused(fake, capsys, manifest: str) -> None:
    ra, _repo, root, results = fake
    results.mkdir(parents=True)
    (results / "run.json").write_text(manifest)
    assert ra.main(_args(root, results, "--only", "good", "--mode", "quick", "--append")) == 2
    assert "is not a run manifest" in capsys.readouterr().err
    assert (results / "run.json").read_text() == manifest  # left as it was
