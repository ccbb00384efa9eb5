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


# --- the code a result ran (code_inputs / same_code) ---------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


class _Module:
    def __init__(self, file: Path) -> None:
        self.__file__ = str(file)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a search package (two modules and a sibling), a service and a bench."""
    for rel in (
        "services/opt/src/fw/opt/__init__.py",
        "services/opt/src/fw/opt/handlers.py",
        "services/opt/src/fw/opt/search/__init__.py",
        "services/opt/src/fw/opt/search/engine.py",
        "services/opt/src/fw/opt/search/lazy.py",
        "bench/b/run.py",
        "bench/b/peers.txt",
        "bench/b/README.md",
        "libs/core/src/fw/core/db.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "first")
    return tmp_path


def _inputs(repo: Path, *rels: str, spawner: bool = False) -> dict:
    modules = {rel: _Module(repo / rel) for rel in rels}
    if spawner:
        modules["flywheel.stack.services"] = _Module(repo / "elsewhere.py")
    return benchstamp.code_inputs(modules, root=repo)


def test_a_result_stands_for_a_commit_until_its_own_code_changes(repo: Path) -> None:
    inputs = _inputs(
        repo, "services/opt/src/fw/opt/__init__.py", "services/opt/src/fw/opt/search/engine.py", "bench/b/run.py"
    )
    stamp = {"inputs": inputs}
    # engine.py, its sibling lazy.py and the bench's folder; not the service's other modules
    assert inputs["files"] == 6 and inputs["untracked"] == []
    (repo / "services/opt/src/fw/opt/handlers.py").write_text("changed\n")
    (repo / "libs/core/src/fw/core/db.py").write_text("changed\n")
    assert benchstamp.same_code(stamp, _commit(repo, "elsewhere"), root=repo) is True
    (repo / "services/opt/src/fw/opt/search/lazy.py").write_text("changed\n")  # a sibling it may import late
    assert benchstamp.same_code(stamp, _commit(repo, "sibling"), root=repo) is False
    (repo / "services/opt/src/fw/opt/search/lazy.py").write_text("# services/opt/src/fw/opt/search/lazy.py\n")
    assert benchstamp.same_code(stamp, _commit(repo, "back"), root=repo) is True
    (repo / "bench/b/peers.txt").write_text("another peer\n")
    assert benchstamp.same_code(stamp, _commit(repo, "bench folder"), root=repo) is False


def test_uncommitted_changes_are_in_the_digest(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "services/opt/src/fw/opt/search/engine.py").write_text("not committed\n")
    dirty = {"inputs": _inputs(repo, "services/opt/src/fw/opt/search/engine.py")}
    assert benchstamp.same_code(dirty, head, root=repo) is False
    assert benchstamp.same_code(dirty, _commit(repo, "now committed"), root=repo) is True


def test_a_process_that_starts_services_ran_all_the_code(repo: Path) -> None:
    stamp = {"inputs": _inputs(repo, "bench/b/run.py", spawner=True)}
    assert stamp["inputs"]["files"] == 8
    (repo / "libs/core/src/fw/core/db.py").write_text("changed\n")
    assert benchstamp.same_code(stamp, _commit(repo, "a library"), root=repo) is False


def test_untracked_code_or_no_inputs_match_no_commit(repo: Path) -> None:
    (repo / "bench/b/scratch.py").write_text("x = 1\n")
    stamp = {"inputs": _inputs(repo, "bench/b/scratch.py")}
    assert stamp["inputs"]["untracked"] == ["bench/b/scratch.py"]
    head = _git(repo, "rev-parse", "HEAD")
    assert benchstamp.same_code(stamp, head, root=repo) is False
    assert benchstamp.same_code({"commit": head}, head, root=repo) is None  # stamped before inputs existed


def test_a_peer_imported_from_the_bench_download_cache_is_not_repository_code(repo: Path) -> None:
    # bench/ope imports obp from its wheel, unpacked into the gitignored bench/.cache: a package,
    # like those in .venv, so the result still matches the commit it ran at.
    (repo / ".gitignore").write_text("bench/.cache/\n")
    head = _commit(repo, "ignore the cache")
    for rel in ("bench/.cache/obp-0.4.1/obp/__init__.py", ".venv/lib/site.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x = 1\n")
    stamp = {"inputs": _inputs(repo, "bench/b/run.py", "bench/.cache/obp-0.4.1/obp/__init__.py", ".venv/lib/site.py")}
    assert stamp["inputs"]["untracked"] == [] and stamp["inputs"]["folders"] == ["bench/b"]
    assert benchstamp.same_code(stamp, head, root=repo) is True


def test_the_stamp_records_the_code_it_ran() -> None:
    inputs = benchstamp.stamp({})["stamp"]["inputs"]
    assert inputs["digest"] and inputs["files"] > 0
    assert "deploy/stack/src/flywheel/stack/benchstamp.py" not in inputs["modules"]  # the stamping itself


def test_a_bench_readme_is_not_code_but_an_old_stamp_keeps_its_rule(repo: Path) -> None:
    stamp = {"inputs": _inputs(repo, "bench/b/run.py")}
    assert stamp["inputs"]["rule"] == benchstamp.INPUTS_RULE == 3
    old = {"inputs": {**stamp["inputs"], "rule": 1}}  # as stamped before Markdown was left out
    old["inputs"]["digest"] = benchstamp._digest(benchstamp._blobs(root=repo), old["inputs"])
    head = _git(repo, "rev-parse", "HEAD")
    assert benchstamp.same_code(stamp, head, root=repo) and benchstamp.same_code(old, head, root=repo)
    (repo / "bench/b/README.md").write_text("figures of the latest run\n")
    edited = _commit(repo, "the bench's README")
    assert benchstamp.same_code(stamp, edited, root=repo) is True  # prose changes no figure
    assert benchstamp.same_code(old, edited, root=repo) is False  # the first rule counted it


def _add(repo: Path, *rels: str) -> str:
    for rel in rels:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"# {rel}\n")
    return _commit(repo, "tests and the stamping")


def test_a_test_or_the_stamping_is_not_code_a_bench_ran(repo: Path) -> None:
    test_file, helper = "services/opt/tests/test_engine.py", "services/opt/tests/helpers.py"
    _add(repo, test_file, helper, "conftest.py", benchstamp.STAMPING)
    stamp = {"inputs": _inputs(repo, "bench/b/run.py", helper, spawner=True)}  # the bench loaded one helper
    for rel in (test_file, benchstamp.STAMPING):
        (repo / rel).write_text("changed\n")
        assert benchstamp.same_code(stamp, _commit(repo, rel), root=repo) is True, rel
    (repo / helper).write_text("changed\n")  # but a test module the bench imported is its code
    assert benchstamp.same_code(stamp, _commit(repo, "helper"), root=repo) is False


def test_an_older_rule_stamp_is_judged_by_todays_rule_through_its_commit(repo: Path) -> None:
    test_file = "services/opt/tests/test_engine.py"
    ran_at = _add(repo, test_file)
    inputs = {**_inputs(repo, "bench/b/run.py", spawner=True), "rule": 2}  # as stamped before rule 3
    inputs["digest"] = benchstamp._digest(benchstamp._blobs(root=repo), inputs)
    old = {"commit": ran_at, "dirty": False, "inputs": inputs}
    (repo / test_file).write_text("a refactored test\n")
    tests_only = _commit(repo, "a test")
    assert benchstamp.same_code(old, tests_only, root=repo) is True
    assert benchstamp.same_code({**old, "dirty": True}, tests_only, root=repo) is False  # its commit is not what ran
    assert benchstamp.same_code({**old, "commit": tests_only}, tests_only, root=repo) is False  # digest disagrees
    assert benchstamp.same_code({k: v for k, v in old.items() if k != "commit"}, tests_only, root=repo) is False
    (repo / "services/opt/src/fw/opt/handlers.py").write_text("changed\n")
    assert benchstamp.same_code(old, _commit(repo, "the service"), root=repo) is False
