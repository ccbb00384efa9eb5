"""``search_space``: the parameters, in The Convergence's forms and their shorthands.

Accepted per parameter (all normalised to ``ParameterSpec``):

- ``{type: categorical, values: [...]}`` (``choices`` is an alias; ``type: choice`` too);
  a bare list ``[a, b]`` is categorical; ``type: bool`` means ``[true, false]``.
- ``{type: discrete, values: [256, 512]}``: numbers, searched by their order.
- ``{type: continuous, min, max, step?, log?}``; ``type: float`` is continuous,
  ``type: int`` (or ``integer``) is continuous with ``step: 1`` and integer values;
  ``scale: log`` or ``distribution: log_uniform`` mean ``log: true``; a mapping with only
  ``min``/``max`` is continuous.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE, Param, SearchSpace

TYPE_ALIASES = {
    "categorical": CATEGORICAL,
    "choice": CATEGORICAL,
    "bool": CATEGORICAL,
    "boolean": CATEGORICAL,
    "discrete": DISCRETE,
    "continuous": CONTINUOUS,
    "float": CONTINUOUS,
    "int": CONTINUOUS,
    "integer": CONTINUOUS,
}


class ParameterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["categorical", "discrete", "continuous"]
    values: list[Any] | None = None
    min: float | None = None
    max: float | None = None
    step: float | None = Field(default=None, gt=0)
    log: bool = False
    integer: bool = False
    default: Any = None
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"type": "categorical", "values": data}
        if not isinstance(data, dict):
            raise ValueError("a parameter is a mapping (type, values or min/max) or a list of choices")
        data = dict(data)
        if "choices" in data:
            if "values" in data:
                raise ValueError("give either values or choices, not both")
            data["values"] = data.pop("choices")
        raw = data.get("type")
        if raw is None:
            data["type"] = "categorical" if "values" in data else "continuous"
        else:
            kind = TYPE_ALIASES.get(str(raw).lower())
            if kind is None:
                raise ValueError(f"unknown parameter type {raw!r}; use one of {sorted(TYPE_ALIASES)}")
            data["type"] = kind
            if str(raw).lower() in ("int", "integer"):
                data["integer"] = True
                data.setdefault("step", 1)
            if str(raw).lower() in ("bool", "boolean"):
                data.setdefault("values", [True, False])
        scale = data.pop("scale", None) or data.pop("distribution", None)
        if scale is not None:
            if str(scale).lower() in ("log", "log_uniform", "loguniform"):
                data["log"] = True
            elif str(scale).lower() not in ("linear", "uniform"):
                raise ValueError(f"unknown scale {scale!r}; use linear or log")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ParameterSpec:
        if self.type in ("categorical", "discrete"):
            if not self.values:
                raise ValueError(f"a {self.type} parameter needs a non-empty list of values")
            if len({repr(v) for v in self.values}) != len(self.values):
                raise ValueError("values has duplicates")
            if self.type == "discrete" and not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in self.values
            ):
                raise ValueError("discrete values must be numbers; use categorical for anything else")
            if self.min is not None or self.max is not None:
                raise ValueError(f"min/max do not apply to a {self.type} parameter (it has values)")
            return self
        if self.values is not None:
            raise ValueError("a continuous parameter has min and max, not values")
        if self.min is None or self.max is None:
            raise ValueError("a continuous parameter needs both min and max")
        if self.min >= self.max:
            raise ValueError(f"min must be less than max (min={self.min}, max={self.max})")
        if self.log and self.min <= 0:
            raise ValueError(f"a log scale needs min > 0 (min={self.min})")
        if self.step is not None and self.step > self.max - self.min:
            raise ValueError(f"step {self.step} is larger than the range {self.max - self.min}")
        return self

    def to_param(self, name: str) -> Param:
        if self.type == "continuous":
            assert self.min is not None and self.max is not None
            return Param(
                name, CONTINUOUS, low=self.min, high=self.max, step=self.step, log=self.log, integer=self.integer
            )
        values = self.values or []
        if self.type == "discrete":
            values = sorted(values)
        return Param(name, self.type, values=tuple(values))


class SearchSpaceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parameters: dict[str, ParameterSpec]
    templates: dict[str, Any] = Field(default_factory=dict)

    @field_validator("parameters")
    @classmethod
    def _not_empty(cls, v: dict[str, ParameterSpec]) -> dict[str, ParameterSpec]:
        if not v:
            raise ValueError("needs at least one parameter")
        return v

    def to_space(self) -> SearchSpace:
        return SearchSpace([spec.to_param(name) for name, spec in self.parameters.items()])
