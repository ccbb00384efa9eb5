"""Rubrics: named, versioned lists of weighted criteria, written as YAML.

The presets ship as package data (``rubrics/*.yaml``) and are read-only; custom rubrics
are stored in PostgreSQL by :mod:`flywheel.reward_judge.rubric_store`, one row per version.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

import yaml

from flywheel.core import yaml_safe
from flywheel.core.errors import InvalidArgument

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
CRITERION = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_CRITERIA = 20
MAX_DESCRIPTION = 2000
PRESETS = (
    "default",
    "customer_service",
    "technical_support",
    "sales",
    "educational",
    "creative_writing",
    "code_assistance",
)


@dataclass(frozen=True)
class Criterion:
    name: str
    description: str
    weight: float


@dataclass(frozen=True)
class Rubric:
    name: str
    version: int
    description: str
    criteria: tuple[Criterion, ...]
    preset: bool = False
    updated_at: datetime | None = field(default=None, compare=False)

    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.criteria}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "criteria": [{"name": c.name, "description": c.description, "weight": c.weight} for c in self.criteria],
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


def validate(rubric: Rubric) -> Rubric:
    """Raise InvalidArgument naming what is wrong; return the rubric unchanged."""
    where = f"rubric {rubric.name!r}"
    if not NAME.fullmatch(rubric.name):
        raise InvalidArgument(f"{where}: name must match {NAME.pattern} (lowercase, 1-64 characters)")
    if rubric.version < 0:
        raise InvalidArgument(f"{where}: version must be >= 0 (0 assigns the next version)")
    if len(rubric.description) > MAX_DESCRIPTION:
        raise InvalidArgument(f"{where}: description is longer than {MAX_DESCRIPTION} characters")
    if not rubric.criteria:
        raise InvalidArgument(f"{where}: needs at least one criterion")
    if len(rubric.criteria) > MAX_CRITERIA:
        raise InvalidArgument(f"{where}: has {len(rubric.criteria)} criteria; at most {MAX_CRITERIA}")
    seen: set[str] = set()
    for c in rubric.criteria:
        if not CRITERION.fullmatch(c.name):
            raise InvalidArgument(f"{where}: criterion name {c.name!r} must match {CRITERION.pattern}")
        if c.name in seen:
            raise InvalidArgument(f"{where}: criterion {c.name!r} appears twice")
        seen.add(c.name)
        if not c.description.strip():
            raise InvalidArgument(f"{where}: criterion {c.name!r} needs a description (the judge reads it)")
        if len(c.description) > MAX_DESCRIPTION:
            raise InvalidArgument(f"{where}: criterion {c.name!r} description is longer than {MAX_DESCRIPTION}")
        if not (math.isfinite(c.weight) and c.weight > 0):
            raise InvalidArgument(f"{where}: criterion {c.name!r} weight must be a finite number > 0, got {c.weight}")
    return rubric


def from_dict(data: Any, *, preset: bool = False) -> Rubric:
    """Build (and validate) a rubric from parsed YAML/JSON."""
    if not isinstance(data, dict):
        raise InvalidArgument("a rubric must be a mapping with name, description and criteria")
    unknown = set(data) - {"name", "version", "description", "criteria"}
    if unknown:
        raise InvalidArgument(
            f"rubric has unknown keys {sorted(unknown)}; expected name, version, description, criteria"
        )
    raw_criteria = data.get("criteria") or []
    if not isinstance(raw_criteria, list):
        raise InvalidArgument("rubric criteria must be a list of {name, description, weight}")
    criteria = []
    for i, c in enumerate(raw_criteria):
        if not isinstance(c, dict) or "name" not in c:
            raise InvalidArgument(f"rubric criterion #{i + 1} must be a mapping with name, description, weight")
        try:
            weight = float(c.get("weight", 1.0))
        except (TypeError, ValueError):
            raise InvalidArgument(f"rubric criterion {c['name']!r}: weight must be a number") from None
        criteria.append(Criterion(str(c["name"]), str(c.get("description", "")), weight))
    try:
        version = int(data.get("version", 0) or 0)
    except (TypeError, ValueError):
        raise InvalidArgument("rubric version must be an integer") from None
    return validate(
        Rubric(
            name=str(data.get("name", "")),
            version=version,
            description=str(data.get("description", "")),
            criteria=tuple(criteria),
            preset=preset,
        )
    )


def from_yaml(
    text: str,
    *,
    field: str = "rubric YAML",
    max_chars: int = yaml_safe.DEFAULT_MAX_CHARS,
    max_nodes: int = 10_000,
) -> Rubric:
    """Parse a rubric written as YAML, within size and alias-expansion limits
    (flywheel.core.yaml_safe); bad YAML is an InvalidArgument naming ``field`` and, for a
    parse error, the parser's position."""
    try:
        data = yaml_safe.load(text, max_chars=max_chars, max_nodes=max_nodes)
    except yaml_safe.YamlLimitError as exc:
        raise InvalidArgument(f"{field} {exc}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{field} does not parse: {exc}") from None
    return from_dict(data)


@cache
def presets() -> dict[str, Rubric]:
    """The shipped presets, by name."""
    folder = resources.files("flywheel.reward_judge.rubrics")
    found = {}
    for name in PRESETS:
        data = yaml.safe_load(folder.joinpath(f"{name}.yaml").read_text(encoding="utf-8"))
        found[name] = from_dict(data, preset=True)
    return found
