"""The whole run config, and loading it from YAML with errors a person can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel.core import yaml_safe

from .evaluation import EvaluationConfig, TestCase, load_test_cases
from .sections import ApiConfig, OptimizationConfig, SocietyConfig
from .space import SearchSpaceConfig


class RunConfigError(ValueError):
    """A config that cannot run. ``problems`` holds one "field.path: what is wrong" per error."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        where = f" in {source}" if source else ""
        super().__init__(f"{len(problems)} problem(s){where}:\n" + "\n".join(f"  - {p}" for p in problems))


class RunConfig(BaseModel):
    """A superset of The Convergence's optimization.yaml."""

    model_config = ConfigDict(extra="forbid")

    api: ApiConfig
    search_space: SearchSpaceConfig
    evaluation: EvaluationConfig
    optimization: OptimizationConfig = Field(default_factory=OptimizationConfig)
    society: SocietyConfig = Field(default_factory=SocietyConfig)
    output: dict[str, Any] = Field(default_factory=dict)  # Convergence's output section, kept as given
    legacy: dict[str, Any] = Field(default_factory=dict)  # Convergence's cross-run tracking: our warm start
    agent: dict[str, Any] = Field(default_factory=dict)

    def test_cases(self, base_dir: Path | str = ".") -> list[TestCase]:
        return load_test_cases(self.evaluation.test_cases, Path(base_dir))


def _path(loc: tuple[Any, ...]) -> str:
    # pydantic puts validator names (function-after[...]) and union branches in loc; people don't
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join(parts) or "(top level)"


def _message(err: dict[str, Any]) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown field (check the spelling)"
    if err["type"] == "missing":
        return "required field is missing"
    if (
        "input" in err
        and err["type"] not in ("value_error", "assertion_error")
        and not isinstance(err["input"], dict | list)
    ):
        msg += f" (got {err['input']!r})"
    return msg


def parse_run_config(data: Any, *, source: str = "") -> RunConfig:
    """Validate a parsed config; raise RunConfigError listing every problem with its field path."""
    if not isinstance(data, dict):
        raise RunConfigError(["(top level): the config must be a mapping with api, search_space, evaluation"], source)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_path(e['loc'])}: {_message(e)}" for e in exc.errors()]
        raise RunConfigError(problems, source) from None


def load_run_config(path: Path | str, *, check_test_cases: bool = True) -> RunConfig:
    """Read and validate a YAML run config (and its test cases, relative to the file)."""
    path = Path(path)
    try:
        data = yaml_safe.load(path.read_text())  # alias and size limits
    except yaml.YAMLError as exc:
        raise RunConfigError([f"(yaml): {exc}"], str(path)) from None
    config = parse_run_config(data, source=str(path))
    if check_test_cases:
        try:
            config.test_cases(path.parent)
        except (ValueError, OSError) as exc:
            raise RunConfigError([str(exc)], str(path)) from None
    return config
