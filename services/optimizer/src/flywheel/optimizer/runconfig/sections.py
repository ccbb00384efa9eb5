"""``api``, ``optimization`` and ``society``: The Convergence's fields plus Flywheel's own."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from flywheel.optimizer.search import SearchSettings


class AuthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _legacy_header(cls, data: Any) -> Any:
        # The Convergence's older spelling of header_name
        if isinstance(data, dict) and "api_key_header" in data:
            data = dict(data)
            header = data.pop("api_key_header")
            data.setdefault("header_name", header)
        return data

    type: Literal["bearer", "api_key", "basic", "oauth", "none"] = "none"
    token_env: str | None = None  # the NAME of an environment variable, never the secret
    header_name: str = "x-api-key"
    username: str | None = None
    password_env: str | None = None


class ApiConfig(BaseModel):
    """What is being optimised. ``kind`` picks the evaluator target: ``llm`` (LiteLLM: ``model``,
    ``api_base``), ``http`` (``endpoint`` with request/response mapping) or ``python``
    (``callable``, "package.module:function"). Without ``kind``: python if ``callable`` is set,
    llm if ``model`` or ``api_base`` is, else http."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    kind: Literal["llm", "http", "python"] | None = None
    endpoint: str | None = None
    model: str | None = None
    api_base: str | None = None
    callable: str | None = None
    models: dict[str, dict[str, Any]] | None = None
    auth: AuthConfig = Field(default_factory=AuthConfig)
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)
    adapter_enabled: bool = False
    mock_mode: bool = False

    @model_validator(mode="after")
    def _target(self) -> ApiConfig:
        if self.kind is None:
            if self.callable:
                self.kind = "python"
            elif self.model or self.api_base:
                self.kind = "llm"
            else:
                self.kind = "http"
        if self.kind == "http" and not (self.endpoint or self.models):
            raise ValueError("an http target needs endpoint (or models)")
        for key, entry in (self.models or {}).items():
            if not isinstance(entry.get("endpoint"), str) or not entry["endpoint"].strip():
                raise ValueError(f"models.{key}: needs endpoint (the URL this model is called at)")
        if self.kind == "python" and (not self.callable or ":" not in self.callable):
            raise ValueError("a python target needs callable: 'package.module:function'")
        if self.kind == "llm" and not (self.model or self.models):
            raise ValueError("an llm target needs model (a LiteLLM model name), optionally with api_base")
        return self


class EarlyStoppingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    patience: int = Field(default=3, ge=1)
    min_improvement: float = Field(default=0.0, ge=0)


class EvolutionConfig(BaseModel):
    """Convergence's names (population_size, mutation_rate...) and the short ones (population,
    mutation...) are both accepted. ``elite_size`` defaults to 2 but never more than
    population_size - 1; a larger one is lowered to that (with a warning, see
    :meth:`RunConfig.warnings`), as The Convergence ran it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    population_size: int = Field(default=20, ge=1, validation_alias=AliasChoices("population_size", "population"))
    generations: int = Field(default=10, ge=1)
    mutation_rate: float = Field(default=0.2, ge=0, le=1, validation_alias=AliasChoices("mutation_rate", "mutation"))
    crossover_rate: float = Field(default=0.7, ge=0, le=1, validation_alias=AliasChoices("crossover_rate", "crossover"))
    elite_size: int = Field(default=2, ge=0, validation_alias=AliasChoices("elite_size", "elite", "elitism"))
    tournament_size: int | None = Field(default=None, ge=2)
    mutation_scale: float = Field(default=0.1, gt=0, le=1)
    surrogate: bool = True
    # elite_size as written, when it had to be lowered (for the warning)
    elite_size_asked: int | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _elite_fits(self) -> EvolutionConfig:
        if self.elite_size >= self.population_size:
            if "elite_size" in self.model_fields_set:
                self.elite_size_asked = self.elite_size
            self.elite_size = self.population_size - 1
        return self


class RacingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    min_cases: int = Field(default=3, ge=1)
    growth: float = Field(default=2.0, gt=1)
    confidence: float = Field(default=0.9, gt=0.5, lt=1)
    # the search's racing_incumbent, racing_incumbent_confidence and racing_revisit (off by default)
    incumbent: bool = False
    incumbent_confidence: float | None = Field(default=None, gt=0.5, lt=1)
    revisit: int = Field(default=0, ge=0)
    # the search's racing_sequential and racing_margin (a test corrected for its repeated looks; off)
    sequential: Literal["none", "bonferroni", "spending", "mixture"] = "none"
    margin: float = Field(default=0.0, ge=0)


class MabConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: Literal["thompson_sampling"] = "thompson_sampling"
    exploration_rate: float = Field(default=0.2, ge=0, le=1)
    confidence_level: float = Field(default=0.95, gt=0, lt=1)


class ExecutionConfig(BaseModel):
    """How the run's evaluations are carried out. ``max_failure_ratio``: the run ends FAILED
    when more than this share of its evaluations failed (errors and timeouts), and early
    once the first ``max(10, 2 x parallel_workers)`` evaluations all failed.
    ``delay_between_calls`` (seconds) paces the run like ``rate_limiting``. ``max_retries``
    (attempts per evaluation, as The Convergence counted them) and ``retry_delay_seconds``
    (the first retry's delay, doubling) go with each request to the evaluator, which caps the
    attempts at its own FLYWHEEL_EVALUATOR_MAX_ATTEMPTS; unset, the evaluator's defaults."""

    model_config = ConfigDict(extra="forbid")

    experiments_per_generation: int | None = Field(default=None, ge=1)
    parallel_workers: int = Field(default=4, ge=1)
    max_retries: int = Field(default=3, ge=0)
    retry_delay_seconds: float | None = Field(default=None, ge=0, le=600)
    delay_between_calls: float | None = Field(default=None, ge=0, le=3600)
    timeout_s: float = Field(default=60.0, gt=0)
    max_failure_ratio: float = Field(default=0.5, ge=0, le=1)
    early_stopping: EarlyStoppingConfig | None = None


class RateLimitingConfig(BaseModel):
    """The Convergence's ``rate_limiting`` section: the run publishes at most this many
    evaluation requests per second/minute (``burst_limit`` at once), so the target sees at
    most that rate of first attempts (the evaluator's retries come on top)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    requests_per_second: float | None = Field(default=None, gt=0)
    requests_per_minute: float | None = Field(default=None, gt=0)
    burst_limit: int = Field(default=1, ge=1)
    backoff_strategy: str = "exponential"


class WarmStartConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    fraction: float = Field(default=0.5, ge=0, le=1)
    max_runs: int = Field(default=5, ge=0)


class OptimizationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["mab_evolution", "genetic", "mab_only", "random"] = "mab_evolution"
    seed: int = 0
    mab: MabConfig = Field(default_factory=MabConfig)
    evolution: EvolutionConfig = Field(default_factory=EvolutionConfig)
    racing: RacingConfig = Field(default_factory=RacingConfig)
    early_stopping: EarlyStoppingConfig | None = None
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    max_evaluations: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _convergence_algorithm(cls, data: Any) -> Any:
        # The Convergence's "evolution" is its genetic algorithm without the bandit part
        if isinstance(data, dict) and data.get("algorithm") == "evolution":
            data = {**data, "algorithm": "genetic"}
        return data

    @model_validator(mode="after")
    def _one_early_stopping(self) -> OptimizationConfig:
        if self.early_stopping is not None and self.execution.early_stopping is not None:
            raise ValueError("early_stopping is set both here and under execution; keep one")
        return self

    def stopping(self) -> EarlyStoppingConfig:
        return self.early_stopping or self.execution.early_stopping or EarlyStoppingConfig()

    def search_settings(self) -> SearchSettings:
        """The search core's settings for this section."""
        evo, stop = self.evolution, self.stopping()
        return SearchSettings(
            population_size=evo.population_size,
            generations=evo.generations,
            mutation_rate=evo.mutation_rate,
            crossover_rate=evo.crossover_rate,
            elite_size=evo.elite_size,
            tournament_size=evo.tournament_size,
            mutation_scale=evo.mutation_scale,
            surrogate=evo.surrogate,
            racing=self.racing.enabled,
            racing_min_cases=self.racing.min_cases,
            racing_growth=self.racing.growth,
            racing_confidence=self.racing.confidence,
            racing_incumbent=self.racing.incumbent,
            racing_incumbent_confidence=self.racing.incumbent_confidence,
            racing_revisit=self.racing.revisit,
            racing_sequential=self.racing.sequential,
            racing_margin=self.racing.margin,
            patience=stop.patience if stop.enabled else None,
            min_improvement=stop.min_improvement,
            max_evaluations=self.max_evaluations,
            warm_start_fraction=self.warm_start.fraction if self.warm_start.enabled else 0.0,
            algorithm=self.algorithm,
            seed=self.seed,
        )


class SocietyConfig(BaseModel):
    """Outside proposers (RLP/SAO) that inject configs into running generations. Sub-sections
    are kept as given for the society service to read."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    auto_generate_agents: bool = True
    # One RLP proposal per generation: bench/rlp measured 2 at +75 evaluations to target, 1 at +17.
    proposals_per_generation: int = Field(default=1, ge=0)
    learning: dict[str, Any] = Field(default_factory=dict)
    collaboration: dict[str, Any] = Field(default_factory=dict)
    llm: dict[str, Any] = Field(default_factory=dict)
    storage: dict[str, Any] = Field(default_factory=dict)
    weave: dict[str, Any] = Field(default_factory=dict)
