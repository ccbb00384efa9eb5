"""Measuring the optimizer of one commit while the working tree is being edited.

``--optimizer-commit REV`` extracts that commit's ``libs/*/src`` and ``services/*/src`` (``git
archive``, nothing in the repository is touched) into a temporary folder and puts them first on
PYTHONPATH, for this process (re-executed) and every optimizer it starts: the editable installs
are plain path entries, which PYTHONPATH precedes. The stack's own code (``deploy/stack``, the
results stamp) stays the working tree's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "FLYWHEEL_SERVICE_REGRET_TREE"  # set in the re-executed process: "<commit> <folder>"


def reexec_at(rev: str) -> None:
    """Re-run this command with ``rev``'s sources first on PYTHONPATH (does not return)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dest = Path(tempfile.mkdtemp(prefix="flywheel-service-regret-tree-"))
    archive = subprocess.run(["git", "archive", commit, "libs", "services"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    srcs = sorted(str(p) for p in [*dest.glob("libs/*/src"), *dest.glob("services/*/src")])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*srcs, *filter(None, [env.get("PYTHONPATH")])])
    env[MARK] = f"{commit} {dest}"
    os.execve(sys.executable, [sys.executable, *sys.argv], env)  # noqa: S606 - this same command again


def current() -> dict[str, str]:
    """Which optimizer code this process and its children run."""
    mark = os.environ.get(MARK)
    if mark:
        commit, folder = mark.split(" ", 1)
        return {"optimizer_code": f"commit {commit} (git archive, uncommitted edits excluded)", "folder": folder}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", "services/optimizer", "libs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    state = "with uncommitted edits to services/optimizer or libs" if dirty else "clean"
    return {"optimizer_code": f"working tree at {head} ({state})"}
