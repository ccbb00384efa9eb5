"""A package's dependency closure, resolved offline: workspace members from their
pyproject.toml files, everything else from the metadata installed in this virtual environment
(the versions the tests run on). Markers are evaluated for this interpreter and the extras asked."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
MEMBER_GLOBS = ("libs/*/pyproject.toml", "services/*/pyproject.toml", "deploy/*/pyproject.toml")


def workspace_members() -> dict[str, dict]:
    """Canonical name -> the [project] table of every workspace member."""
    members: dict[str, dict] = {}
    for pattern in MEMBER_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            project = tomllib.loads(path.read_text())["project"]
            members[canonicalize_name(project["name"])] = project
    return members


def _requirements(name: str, members: dict[str, dict]) -> list[str]:
    if name in members:
        project = members[name]
        reqs = list(project.get("dependencies", []))
        for extra, deps in project.get("optional-dependencies", {}).items():
            reqs += [f"{d} ; extra == '{extra}'" if ";" not in d else d for d in deps]
        return reqs
    try:
        return metadata.distribution(name).requires or []
    except metadata.PackageNotFoundError as exc:
        raise AssertionError(
            f"{name} is in the closure but not installed in this environment (run scripts/setup.sh)"
        ) from exc


def closure(root: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution (canonical names) that installing ``root[extras]`` pulls in, root included."""
    members = workspace_members()
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(canonicalize_name(root), frozenset(extras))]
    expanded: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, want = todo.pop()
        if (name, want) in expanded:
            continue
        expanded.add((name, want))
        seen.add(name)
        for line in _requirements(name, members):
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *want)):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return seen
