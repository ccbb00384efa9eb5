"""The whole run config, and loading it from YAML with errors a person can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flywheel.core import yaml_safe

from .errors import ProblemsError, problems_of
from .evaluation import EvaluationConfig, TestCase, load_test_cases
from .sections import ApiConfig, OptimizationConfig, RateLimitingConfig, SocietyConfig
from .space import SearchSpaceConfig


class RunConfigError(ProblemsError):
    """A config that cannot run. ``problems`` holds one "field.path: what is wrong" per error."""


class RunConfig(BaseModel):
    """A superset of The Convergence's optimization.yaml. What Flywheel reads but cannot
    honour is listed by :meth:`warnings` (printed by the CLI, returned by GetRun)."""

    model_config = ConfigDict(extra="forbid")

    api: ApiConfig
    search_space: SearchSpaceConfig
    evaluation: EvaluationConfig
    optimization: OptimizationConfig = Field(default_factory=OptimizationConfig)
    society: SocietyConfig = Field(default_factory=SocietyConfig)
    rate_limiting: RateLimitingConfig | None = None
    output: dict[str, Any] = Field(default_factory=dict)  # Convergence's output section, kept as given
    legacy: dict[str, Any] = Field(default_factory=dict)  # Convergence's cross-run tracking: our warm start
    agent: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _models_cover_the_model_parameter(self) -> RunConfig:
        models = self.api.models
        param = self.search_space.parameters.get("model")
        if self.api.kind == "http" and models and not self.api.endpoint:
            if param is None or not param.values:
                raise ValueError("api.models: the URL is picked by the search_space parameter 'model'; add it")
            missing = [v for v in param.values if str(v) not in models]
            if missing:
                raise ValueError(
                    f"search_space.parameters.model: {missing} not in api.models (known: {sorted(models)})"
                )
        return self

    def test_cases(self, base_dir: Path | str = ".") -> list[TestCase]:
        return load_test_cases(self.evaluation.test_cases, Path(base_dir))

    def timeout_s(self) -> float:
        """Per-call timeout: execution.timeout_s, or The Convergence's api.request.timeout_seconds."""
        execution = self.optimization.execution
        asked = self.api.request.get("timeout_seconds")
        if "timeout_s" not in execution.model_fields_set and isinstance(asked, int | float) and asked > 0:
            return float(asked)
        return execution.timeout_s

    def max_attempts(self) -> int:
        """Calls per evaluation from ``execution.max_retries`` when the config sets it (The
        Convergence's max_retries counted every attempt, the first included); 0 leaves the
        evaluator's default. The evaluator caps it at its own FLYWHEEL_EVALUATOR_MAX_ATTEMPTS."""
        execution = self.optimization.execution
        return max(1, execution.max_retries) if "max_retries" in execution.model_fields_set else 0

    def request_interval_s(self) -> float:
        """Seconds between two evaluation requests of this run (0: no pacing), from
        rate_limiting and execution.delay_between_calls; the strictest wins."""
        gaps = [self.optimization.execution.delay_between_calls or 0.0]
        limit = self.rate_limiting
        if limit is not None and limit.enabled:
            if limit.requests_per_second:
                gaps.append(1.0 / limit.requests_per_second)
            if limit.requests_per_minute:
                gaps.append(60.0 / limit.requests_per_minute)
        return max(gaps)

    def _society_warnings(self) -> list[str]:
        """The optimizer does not act on ``society``: the society service reads it from the
        runs it watches (RLP proposals before each generation, SAO rounds)."""
        society = self.society
        if not society.enabled:
            return []
        learning = society.learning
        active = [name for name, key in (("RLP", "rlp_enabled"), ("SAO", "sao_enabled")) if learning.get(key)]
        if not active:
            return [
                "society.enabled: neither society.learning.rlp_enabled nor society.learning.sao_enabled is set; "
                "the society does nothing for this run"
            ]
        return [
            f"society.enabled: the society service does {' and '.join(active)} for this run (it watches running "
            "runs; RLP proposals join the next generation); where none is deployed the run goes on with its own search"
        ]

    def warnings(self) -> list[str]:
        """Fields this config sets that Flywheel reads but does not act on (or acts on
        differently), each ``field.path: what happens instead``."""
        out = []
        api, opt = self.api, self.optimization
        evo, execution = opt.evolution, opt.execution
        out += self._society_warnings()
        if api.adapter_enabled:
            out.append(
                "api.adapter_enabled: The Convergence's API adapters (BrowserBase, Agno...) are not part of "
                "Flywheel; requests go to the endpoint as plain HTTP (the test input merged with the params)"
            )
        if api.mock_mode:
            out.append("api.mock_mode: not supported; the target is called for real")
        for key in ("success_field", "error_field"):
            if key in api.response:
                out.append(f"api.response.{key}: not read; an HTTP status of 400 or more is a failed evaluation")
        if self.agent:
            out.append(
                "agent: kept as given but not used (Flywheel does not run Agno agents; "
                "its models registry goes in api.models)"
            )
        if self.legacy.get("enabled"):
            out.append(
                "legacy: The Convergence's cross-run tracking is replaced by optimization.warm_start "
                "(earlier succeeded runs on the same search space); its sqlite/export settings are not used"
            )
        unused_output = sorted(set(self.output) - {"save_path"})
        if self.output:
            out.append(
                "output: not used; every run has best_config.json, detailed_results.json, report.md and "
                "report.html (flywheel runs download RUN_ID)"
                + (f" (ignored: {', '.join(unused_output)})" if unused_output else "")
            )
        if evo.elite_size_asked is not None:
            out.append(
                f"optimization.evolution.elite_size: {evo.elite_size_asked} is not below population_size "
                f"{evo.population_size}; {evo.elite_size} used"
            )
        mab_set = sorted(opt.mab.model_fields_set - {"strategy"})
        if mab_set:
            out.append(
                f"optimization.mab.{', optimization.mab.'.join(mab_set)}: not used (racing and the surrogate "
                "decide how much to explore)"
            )
        if execution.experiments_per_generation is not None:
            out.append(
                "optimization.execution.experiments_per_generation: not used; a generation evaluates "
                "population_size configs on the test cases racing keeps"
            )
        if self.rate_limiting is not None and self.rate_limiting.backoff_strategy != "exponential":
            out.append("rate_limiting.backoff_strategy: only exponential backoff is supported; it is used")
        return out


def parse_run_config(data: Any, *, source: str = "") -> RunConfig:
    """Validate a parsed config; raise RunConfigError listing every problem with its field path."""
    if not isinstance(data, dict):
        raise RunConfigError(["(top level): the config must be a mapping with api, search_space, evaluation"], source)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(problems_of(exc), source) from None


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
        except ProblemsError as exc:
            raise RunConfigError(exc.problems, str(path)) from None
        except (ValueError, OSError) as exc:
            raise RunConfigError([str(exc)], str(path)) from None
    return config
