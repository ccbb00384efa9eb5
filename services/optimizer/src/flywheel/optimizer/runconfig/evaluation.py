"""``evaluation``: test cases and metrics.

Metrics: ``type`` is what measures it (``llm_judge``, ``exact_match``, ``similarity``,
``latency``, ``cost``, ``custom``). The Convergence put the direction in ``type``
(``higher_is_better`` / ``lower_is_better``) and the measure in ``function``; both forms are
read: the direction goes to ``direction`` and the measure comes from ``function``, or from
the metric's name (``latency*`` → latency, ``cost*`` → cost), else ``custom``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .augmentation import AugmentationConfig, augment
from .errors import ProblemsError, problems_of

METRIC_TYPES = ("llm_judge", "exact_match", "similarity", "latency", "cost", "custom")
DIRECTIONS = ("higher_is_better", "lower_is_better")


class MetricSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["llm_judge", "exact_match", "similarity", "latency", "cost", "custom"]
    weight: float = Field(default=1.0, ge=0)
    direction: Literal["higher_is_better", "lower_is_better"] = "higher_is_better"
    threshold: float | None = None
    budget_per_call: float | None = Field(default=None, ge=0)
    rubric: str | None = None  # llm_judge: what the judge scores against
    callable: str | None = None  # custom: "package.module:function"
    description: str = ""  # kept for the reports
    # How a custom callable is called: "flywheel" fn(output, expected, input), or
    # "convergence" fn(result, expected, params, metric=name) (evaluation.custom_evaluator)
    signature: Literal["flywheel", "convergence"] = "flywheel"

    @model_validator(mode="before")
    @classmethod
    def _convergence_form(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("a metric is a mapping with at least a type or a weight")
        data = dict(data)
        raw = data.get("type")
        function = data.pop("function", None)
        if raw in DIRECTIONS:
            data["direction"] = raw
            raw = None
        if raw is None:
            raw = function or "custom"
        if raw not in METRIC_TYPES:
            raise ValueError(f"unknown metric type {raw!r}; use one of {list(METRIC_TYPES)}")
        data["type"] = raw
        if raw in ("latency", "cost"):
            data.setdefault("direction", "lower_is_better")
        if "module" in data:  # Convergence's custom evaluator spelling
            data["callable"] = f"{data.pop('module')}:{data.pop('function_name', 'score_response')}"
        return data

    @model_validator(mode="after")
    def _needs(self) -> MetricSpec:
        if self.type == "custom" and self.callable is not None and ":" not in self.callable:
            raise ValueError("callable must look like 'package.module:function'")
        return self


def _kind_from_name(name: str) -> str:
    lowered = name.lower()
    if "latency" in lowered or "speed" in lowered:
        return "latency"
    if "cost" in lowered:
        return "cost"
    return "custom"


# Test-case fields The Convergence's files carry for people (and its Agno adapters): kept in
# metadata, not an error. Other unknown fields still are (a typo of input or expected).
DESCRIPTIVE_CASE_FIELDS = ("description", "name", "function", "category", "tags", "notes")
_CASE_FIELDS = ["input", "expected", "metadata"]


class TestCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = ""
    input: Any
    expected: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _descriptive_to_metadata(cls, data: Any) -> Any:
        if isinstance(data, dict) and "input" not in data:
            # The Convergence's BrowserBase cases put url, selector... at the top: they are the input
            rest = {k: v for k, v in data.items() if k not in ("id", "expected", "metadata", *DESCRIPTIVE_CASE_FIELDS)}
            # ...unless one is a misspelt field name ("inptu"): that stays an error naming it
            if rest and not any(difflib.get_close_matches(str(k), _CASE_FIELDS, cutoff=0.7) for k in rest):
                data = {k: v for k, v in data.items() if k not in rest} | {"input": rest}
        if isinstance(data, dict) and any(k in data for k in DESCRIPTIVE_CASE_FIELDS):
            data = dict(data)
            metadata = dict(data.get("metadata") or {}) if isinstance(data.get("metadata"), dict | None) else None
            if metadata is not None:
                for key in DESCRIPTIVE_CASE_FIELDS:
                    if key in data:
                        metadata.setdefault(key, data.pop(key))
                data["metadata"] = metadata
        return data


class TestCasesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    inline: list[TestCase] | None = None
    augmentation: AugmentationConfig = Field(default_factory=AugmentationConfig)

    @model_validator(mode="before")
    @classmethod
    def _list_shorthand(cls, data: Any) -> Any:
        return {"inline": data} if isinstance(data, list) else data

    @model_validator(mode="after")
    def _one_source(self) -> TestCasesConfig:
        if (self.path is None) == (self.inline is None):
            raise ValueError("give exactly one of path (a JSON/JSONL file) or inline (a list)")
        return self


class CustomEvaluatorConfig(BaseModel):
    """The Convergence's scorer for its ``function: custom`` metrics: ``module.function(result,
    expected, params, metric=name)``, called by the evaluator for each such metric that has
    no ``callable`` of its own (the run policy's callable_modules must allow the module)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    module: str | None = None
    function: str = "score_response"

    @model_validator(mode="after")
    def _module_when_enabled(self) -> CustomEvaluatorConfig:
        if self.enabled and not self.module:
            raise ValueError("module: required when the custom evaluator is enabled")
        return self

    @property
    def callable(self) -> str:
        return f"{self.module}:{self.function}"


class EvaluationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    test_cases: TestCasesConfig
    metrics: dict[str, MetricSpec]
    custom_evaluator: CustomEvaluatorConfig | None = None
    required_metrics: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _name_metrics(cls, data: Any) -> Any:
        # a metric without a measure takes it from its name: `latency_ms: {weight: 0.3}` is latency
        if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
            data = dict(data)
            metrics = {}
            for name, spec in data["metrics"].items():
                if isinstance(spec, dict) and spec.get("type") in (None, *DIRECTIONS) and "function" not in spec:
                    spec = {**spec, "function": _kind_from_name(name)}
                metrics[name] = spec
            data["metrics"] = metrics
        return data

    @model_validator(mode="after")
    def _check(self) -> EvaluationConfig:
        if not self.metrics:
            raise ValueError("metrics: needs at least one metric")
        if sum(m.weight for m in self.metrics.values()) <= 0:
            raise ValueError("metrics: the weights must not all be zero")
        unknown = [m for m in self.required_metrics if m not in self.metrics]
        if unknown:
            raise ValueError(f"required_metrics names unknown metrics {unknown}; defined: {sorted(self.metrics)}")
        custom = self.custom_evaluator
        if custom is not None and custom.enabled:
            for spec in self.metrics.values():
                if spec.type == "custom" and not spec.callable:
                    spec.callable, spec.signature = custom.callable, "convergence"
        return self

    def unscored(self) -> list[str]:
        """Custom metrics with nothing to score them (no callable, no custom evaluator)."""
        return [name for name, m in self.metrics.items() if m.type == "custom" and not m.callable]

    def weights(self) -> dict[str, float]:
        """Weights normalised to sum to 1 (The Convergence asked users to do it by hand)."""
        total = sum(m.weight for m in self.metrics.values())
        return {name: m.weight / total for name, m in self.metrics.items()}


def load_test_cases(config: TestCasesConfig, base_dir: Path) -> list[TestCase]:
    """The test cases, from inline or a JSON list / {"test_cases": [...]} / JSONL file; ids
    default to ``case-<n>`` and must be unique. With ``augmentation.enabled`` the variants
    follow (see :mod:`.augmentation`)."""
    if config.inline is not None:
        raw: list[Any] = [c.model_dump() for c in config.inline]
    else:
        assert config.path is not None
        path = (base_dir / config.path).resolve()
        if not path.is_file():
            raise ValueError(f"evaluation.test_cases.path: file not found: {path}")
        text = path.read_text()
        if path.suffix == ".jsonl":
            raw = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            raw = data.get("test_cases", []) if isinstance(data, dict) else data
    cases, problems = [], []
    where = "evaluation.test_cases" + (".inline" if config.inline is not None else f" ({config.path})")
    for i, item in enumerate(raw):
        try:
            case = TestCase.model_validate(item)
        except ValidationError as exc:
            problems += problems_of(exc, f"{where}[{i}]")
            continue
        cases.append(case.model_copy(update={"id": case.id or f"case-{i + 1}"}))
    if problems:
        raise ProblemsError(problems)
    if not cases:
        raise ValueError("evaluation.test_cases: no test cases")
    ids = [c.id for c in cases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"evaluation.test_cases: duplicate ids {dupes}")
    if config.augmentation.enabled:
        cases = [TestCase.model_validate(c) for c in augment([c.model_dump() for c in cases], config.augmentation)]
    return cases
