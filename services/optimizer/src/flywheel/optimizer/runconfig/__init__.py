"""Run configs: a superset of The Convergence's ``optimization.yaml`` (api, search_space,
evaluation, optimization, society), validated with pydantic.

    config = load_run_config("examples/capitals/optimization.yaml")
    space = config.search_space.to_space()          # flywheel.optimizer.search.SearchSpace
    settings = config.optimization.search_settings()
    cases = config.test_cases(base_dir)             # inline or from a JSON / JSONL file

Errors are ``RunConfigError`` with one ``field.path: what is wrong`` line per problem.
"""

from .evaluation import METRIC_TYPES, EvaluationConfig, MetricSpec, TestCase, TestCasesConfig, load_test_cases
from .model import RunConfig, RunConfigError, load_run_config, parse_run_config
from .sections import (
    ApiConfig,
    AuthConfig,
    EarlyStoppingConfig,
    EvolutionConfig,
    OptimizationConfig,
    RacingConfig,
    SocietyConfig,
)
from .space import ParameterSpec, SearchSpaceConfig

__all__ = [
    "METRIC_TYPES",
    "ApiConfig",
    "AuthConfig",
    "EarlyStoppingConfig",
    "EvaluationConfig",
    "EvolutionConfig",
    "MetricSpec",
    "OptimizationConfig",
    "ParameterSpec",
    "RacingConfig",
    "RunConfig",
    "RunConfigError",
    "SearchSpaceConfig",
    "SocietyConfig",
    "TestCase",
    "TestCasesConfig",
    "load_run_config",
    "load_test_cases",
    "parse_run_config",
]
