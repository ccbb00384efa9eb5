"""Stamping and writing benchmark results: one helper for every ``bench/<name>/run.py``.

Every results JSON says which code produced it (git commit, and whether the tree had
uncommitted changes), when, on which machine and with which command line, so a figure in
``bench/README.md`` can always be traced back and reproduced. ``bench/make_readme.py``
builds the README's tables from these stamps; nothing there is copied by hand.
"""

from __future__ import annotations

import contextlib
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


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
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
