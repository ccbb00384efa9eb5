"""Stamping and writing benchmark results: one helper for every ``bench/<name>/run.py``.

Every results JSON says which code produced it (git commit, and whether the tree had
uncommitted changes), when, on which machine and with which command line, so a figure in
``bench/README.md`` can always be traced back and reproduced. ``bench/make_readme.py``
builds the README's tables from these stamps; nothing there is copied by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[5]
RESULTS = ROOT / "bench" / "results"


def _git(*args: str, root: Path = ROOT) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out


def git_commit() -> dict[str, Any]:
    """The commit of the working tree and whether it had changes to tracked files. Results
    (``bench/results/``) do not count: in a run of every bench, each one writes its JSON there
    before the next starts, and that is not a change to the code being measured."""
    commit = _git("rev-parse", "HEAD") or "unknown"
    results = f":(exclude){RESULTS.relative_to(ROOT).as_posix()}"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", results))
    return {"commit": commit, "dirty": dirty}


# A process that imports these starts services or servers: it runs code it never imports itself.
SPAWNERS = ("flywheel.stack.services", "flywheel.stack.servers")
CODE_TREES = ("libs", "services", "deploy/stack/src")


def _blobs(commit: str | None = None, root: Path = ROOT) -> dict[str, str]:
    """Path -> git blob id of every tracked file: as it is in the working tree (``commit``
    None; a changed file gets the id of its current content) or at ``commit``."""
    if commit is not None:
        listed = _git("ls-tree", "-r", commit, root=root)
        return {ln.split("\t", 1)[1]: ln.split()[2] for ln in listed.splitlines() if "\t" in ln}
    staged = _git("ls-files", "-s", root=root)
    blobs = {ln.split("\t", 1)[1]: ln.split()[1] for ln in staged.splitlines() if "\t" in ln}
    changed = [f for f in _git("diff", "--name-only", root=root).splitlines() if (root / f).is_file()]
    if changed:
        blobs.update(zip(changed, _git("hash-object", "--", *changed, root=root).splitlines(), strict=True))
    return blobs


# Folders of the repository that hold other people's code, not ours: installed packages, and the
# wheels a bench downloads and imports from its cache (obp in bench/ope). Ignored by git; their
# versions are the bench's params, not its code inputs (a file git does not know would otherwise
# make the result match no commit).
THIRD_PARTY = (".venv", "bench/.cache")

# Which files a digest covers. 1: the first rule. 2: the same without Markdown files, whose edits
# (a bench's README) change no figure. 3: also without tests (files under a ``tests`` folder,
# ``test_*.py``, ``conftest.py``) that the bench did not load, and without this stamping module,
# which writes the figures but does not make them. A stamp keeps the rule it was made with;
# ``same_code`` judges an older stamp by today's rule through the commit it names.
INPUTS_RULE = 3

STAMPING = Path(__file__).resolve().relative_to(ROOT).as_posix()  # this module, as git names it


def _is_test(path: str) -> bool:
    *folders, name = path.split("/")
    return "tests" in folders or name.startswith("test_") or name == "conftest.py"


def _selected(path: str, inputs: dict[str, Any], rule: int | None = None) -> bool:
    rule = inputs.get("rule", 1) if rule is None else rule
    if rule >= 2 and path.endswith(".md"):
        return False
    if path in inputs["modules"]:
        return True
    if rule >= 3 and (path == STAMPING or _is_test(path)):
        return False
    return (path.rsplit("/", 1)[0] in inputs["module_dirs"] and path.endswith(".py")) or any(
        path.startswith(f"{folder}/") for folder in inputs["folders"]
    )


def _digest(blobs: dict[str, str], inputs: dict[str, Any], rule: int | None = None) -> str:
    lines = "".join(f"{p} {b}\n" for p, b in sorted(blobs.items()) if _selected(p, inputs, rule))
    return hashlib.sha256(lines.encode()).hexdigest()


def code_inputs(modules: dict[str, Any] | None = None, root: Path = ROOT) -> dict[str, Any]:
    """The repository code this process ran, so that a result can be matched to any commit
    whose copy of that code is identical (``same_code``): every loaded module file of the
    repository, the other modules beside each (a lazy import of a sibling), the running
    bench's folder whole, and, when the process can start services or servers (``SPAWNERS``),
    all of ``CODE_TREES``; Markdown files left out (``INPUTS_RULE``). ``digest`` hashes those
    files' paths and git blob ids; ``untracked`` lists loaded files git does not know (a result
    that ran one matches no commit)."""
    modules = sys.modules if modules is None else modules
    loaded: set[str] = set()
    module_dirs: set[str] = set()
    folders: set[str] = set()
    for name, module in list(modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or name == __name__:  # the stamping is not the code measured
            continue
        path = Path(file).resolve()
        if not path.is_file() or not path.is_relative_to(root):
            continue
        if any(path.is_relative_to(root / folder) for folder in THIRD_PARTY):
            continue
        rel = path.relative_to(root)
        loaded.add(rel.as_posix())
        if path.name != "__init__.py":  # a package's __init__ alone is loaded as every submodule's parent
            module_dirs.add(rel.parent.as_posix())
        if rel.parts[0] == "bench" and len(rel.parts) > 2:
            folders.add(Path(*rel.parts[:2]).as_posix())
    if any(name in modules for name in SPAWNERS):
        folders.update(CODE_TREES)
    inputs: dict[str, Any] = {
        "rule": INPUTS_RULE,
        "modules": sorted(loaded),
        "module_dirs": sorted(module_dirs),
        "folders": sorted(folders),
    }
    blobs = _blobs(root=root)
    inputs["untracked"] = sorted(loaded - set(blobs))
    inputs["digest"] = _digest(blobs, inputs)
    inputs["files"] = sum(1 for p in blobs if _selected(p, inputs))
    return inputs


def same_code(stamp: dict[str, Any], commit: str, root: Path = ROOT) -> bool | None:
    """Whether the code a result's ``stamp`` recorded (``code_inputs``) is identical at
    ``commit``: the figures then stand for that commit too. None when the stamp has no
    inputs (written before they were recorded). A stamp of an older ``INPUTS_RULE`` that
    names the clean commit it ran at is also judged by today's rule: that commit's files
    (checked against the stamp's digest) against ``commit``'s, so that a change today's rule
    leaves out (a test, the stamping) does not make its figures stale."""
    inputs = stamp.get("inputs")
    if not isinstance(inputs, dict) or not inputs.get("digest"):
        return None
    if inputs.get("untracked"):
        return False
    blobs = _blobs(commit, root)
    if not blobs:
        return False
    if _digest(blobs, inputs) == inputs["digest"]:
        return True
    ran_at = stamp.get("commit")
    if inputs.get("rule", 1) >= INPUTS_RULE or not isinstance(ran_at, str) or not ran_at or stamp.get("dirty"):
        return False
    ran = _blobs(ran_at, root)
    if not ran or _digest(ran, inputs) != inputs["digest"]:
        return False  # a commit this clone lacks, or not the code that ran
    return _digest(ran, inputs, INPUTS_RULE) == _digest(blobs, inputs, INPUTS_RULE)


def machine(packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """CPU model, cores, memory, OS and Python, and the versions of ``packages`` (if installed)."""
    cpu = platform.processor() or platform.machine() or "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    memory_gib = None
    with contextlib.suppress(OSError, StopIteration, ValueError):
        kib = next(
            int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")
        )
        memory_gib = round(kib / 2**20, 1)
    versions = {}
    for name in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    load = None
    with contextlib.suppress(OSError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_at_start": load,
        "packages": versions,
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as it would be typed from the repository root."""
    args = list(sys.argv if argv is None else argv)
    if args:
        with contextlib.suppress(ValueError):
            args[0] = str(Path(args[0]).resolve().relative_to(ROOT))
    return "python " + shlex.join(args)


def stamp(result: dict[str, Any], *, packages: tuple[str, ...] = (), argv: list[str] | None = None) -> dict[str, Any]:
    """``result`` with a ``stamp`` entry (commit, dirty, date, command) and a ``machine`` entry
    (kept if the benchmark already filled one in, with the stamp's fields added)."""
    out = dict(result)
    out["stamp"] = {
        **git_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(argv),
        "inputs": code_inputs(),
    }
    found = machine(packages)
    out["machine"] = {**found, **out.get("machine", {})} if isinstance(out.get("machine"), dict) else found
    return out


def write_results(
    name: str,
    result: dict[str, Any],
    *,
    out: Path | None = None,
    packages: tuple[str, ...] = (),
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Stamp ``result``, write it to ``out`` (default ``bench/results/<name>.json``) atomically,
    print it as one JSON line (the benchmarks' convention: the last line is the result) and
    return it."""
    stamped = stamp({"name": name, **result}, packages=packages, argv=argv)
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(stamped, indent=2, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    print(json.dumps(stamped, separators=(",", ":"), ensure_ascii=False, default=str))
    return stamped
