"""Which of the reasoning model's proposals go to the run: the k best-predicted, new ones only,
each checked against the run's ``search_space``.

Pure (no I/O). The search space is the run YAML's ``search_space`` section as declared (either
the whole section, ``{"parameters": {...}, "templates": ...}``, or its ``parameters`` mapping),
in the forms the optimizer's run config accepts (``runconfig/space.py``): a bare list is
categorical; ``{type: categorical|choice|bool, values|choices}``; ``{type: discrete, values}``
(numbers); ``{type: continuous|float|int|integer, min, max, step?, log?}`` (a mapping with only
``min``/``max`` is continuous). A proposal whose value is not a declared choice, lies outside
the range, or misses a parameter (that declares no ``default``) is dropped, never repaired;
continuous values are snapped onto their ``step`` grid and discrete ones onto the listed
number, as the optimizer does on ``inject``. Parameters the space does not declare are
removed from the proposal (the run could not set them)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flywheel.society.rlp.thoughts import ParseResult, ProposedConfig, finite_number

_CATEGORICAL, _DISCRETE, _CONTINUOUS = "categorical", "discrete", "continuous"
_KINDS = {
    "categorical": _CATEGORICAL,
    "choice": _CATEGORICAL,
    "bool": _CATEGORICAL,
    "boolean": _CATEGORICAL,
    "discrete": _DISCRETE,
    "continuous": _CONTINUOUS,
    "float": _CONTINUOUS,
    "int": _CONTINUOUS,
    "integer": _CONTINUOUS,
}
_MISSING = object()


class SpaceError(ValueError):
    """The search space itself cannot be read; the message names the parameter."""


@dataclass(frozen=True)
class _Spec:
    name: str
    kind: str
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    integer: bool = False
    default: Any = _MISSING

    def check(self, value: Any) -> tuple[Any, str]:
        """(the value as the space holds it, "") or (None, why it does not fit)."""
        if self.kind == _CATEGORICAL:
            for choice in self.values:  # exact first: 1 must not match True
                if type(choice) is type(value) and choice == value:
                    return choice, ""
            # a model writes "512" for 512 or "True" for true: the same choice spelt as text
            spelt = [c for c in self.values if _spelling(c) == _spelling(value)]
            if len(spelt) == 1:
                return spelt[0], ""
            return None, f"{self.name}: {value!r} is not one of {list(self.values)}"
        number = finite_number(value)
        if number is None:
            return None, f"{self.name}: expected a number, got {value!r}"
        if self.kind == _DISCRETE:
            nearest = min(self.values, key=lambda v: abs(float(v) - number))
            if not math.isclose(float(nearest), number, rel_tol=1e-9, abs_tol=1e-12):
                return None, f"{self.name}: {value!r} is not one of {list(self.values)}"
            return nearest, ""
        if not self.low - 1e-9 <= number <= self.high + 1e-9:
            return None, f"{self.name}: {value!r} is outside [{self.low}, {self.high}]"
        return self._snap(number), ""

    def _snap(self, x: float) -> Any:
        # The optimizer's Param.snap: clip, round to the step grid anchored at low.
        x = min(self.high, max(self.low, x))
        if self.step:
            k = round((x - self.low) / self.step)
            x = self.low + k * self.step
            if x > self.high + 1e-12:
                x -= self.step
            x = round(x, 12)
        return round(x) if self.integer else float(x)


def read_space(space: Mapping[str, Any]) -> dict[str, _Spec]:
    """The parameters of a ``search_space`` section (or of its ``parameters`` mapping).
    SpaceError naming the parameter for a form the run config would refuse."""
    if not isinstance(space, Mapping):
        raise SpaceError(f"search_space: expected a mapping, got {type(space).__name__}")
    params = space.get("parameters") if isinstance(space.get("parameters"), Mapping) else space
    specs = {}
    for name, raw in params.items():
        if name == "templates" and params is space:
            continue  # the section's templates, given without its parameters key
        specs[str(name)] = _spec(str(name), raw)
    if not specs:
        raise SpaceError("search_space: no parameters")
    return specs


def validate_params(params: Mapping[str, Any], specs: Mapping[str, _Spec]) -> tuple[dict[str, Any] | None, str]:
    """(the config restricted to the space's parameters and snapped onto it, "") or (None, why
    it was dropped). ``specs`` from :func:`read_space`."""
    out = {}
    for name, spec in specs.items():
        value = params.get(name, _MISSING)
        if value is _MISSING:
            if spec.default is _MISSING:
                return None, f"{name}: missing (the space declares no default)"
            value = spec.default
        checked, why = spec.check(value)
        if why:
            return None, why
        out[name] = checked
    return out, ""


def dedup_key(params: Mapping[str, Any]) -> str:
    """A config's identity for deduplication: ``config_key`` with integral floats written as
    ints, so 512.0 (a number that went through protobuf's Struct) and 512 are the same config."""
    return json.dumps({k: _plain(v) for k, v in params.items()}, sort_keys=True, separators=(",", ":"), default=str)


def choose_proposals(
    result: ParseResult, *, seen: set[str], space: Mapping[str, Any], k: int
) -> list[tuple[int, ProposedConfig]]:
    """The ``k`` best-predicted proposals across the parsed thoughts, as (thought index,
    proposal), highest predicted score first; equal predictions keep thought order (then the
    order within the thought).

    Each proposal is restricted and validated against ``space`` (see the module docstring;
    invalid ones are dropped) and returned with the validated params, its predicted score and
    sigma. Configs in ``seen`` (``ProposedConfig.key``/``config_key`` strings of configs the run
    already has; compared after putting them onto the space too) and repeats are skipped. A
    failed parse gives no proposals. ValueError for a negative ``k``; SpaceError for a space
    the run config would refuse."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k: expected a non-negative int, got {k!r}")
    specs = read_space(space)
    if not result.ok or k == 0:
        return []
    taken = _seen_keys(seen, specs)
    ranked = sorted(
        (
            (-proposal.predicted_score, i, j, proposal)
            for i, thought in enumerate(result.thoughts)
            for j, proposal in enumerate(thought.proposals)
            if math.isfinite(proposal.predicted_score)
        ),
        key=lambda row: row[:3],
    )
    chosen: list[tuple[int, ProposedConfig]] = []
    for _, i, _, proposal in ranked:
        params, _why = validate_params(proposal.params, specs)
        if params is None:
            continue
        key = dedup_key(params)
        if key in taken:
            continue
        taken.add(key)
        chosen.append((i, ProposedConfig(params, proposal.predicted_score, proposal.sigma)))
        if len(chosen) == k:
            break
    return chosen


def _seen_keys(seen: Iterable[str], specs: Mapping[str, _Spec]) -> set[str]:
    out = set()
    for key in seen:
        out.add(key)
        try:
            params = json.loads(key)
        except (TypeError, ValueError):
            continue
        if isinstance(params, dict):
            out.add(dedup_key(params))
            valid, _ = validate_params(params, specs)
            if valid is not None:
                out.add(dedup_key(valid))
    return out


def _spec(name: str, raw: Any) -> _Spec:
    if isinstance(raw, list | tuple):
        raw = {"type": "categorical", "values": list(raw)}
    if not isinstance(raw, Mapping):
        raise SpaceError(f"search_space.{name}: a parameter is a mapping or a list of choices, got {raw!r}")
    data = dict(raw)
    values = data.get("values", data.get("choices"))
    given = str(data.get("type", "")).lower()
    if given:
        kind = _KINDS.get(given)
        if kind is None:
            raise SpaceError(f"search_space.{name}: unknown type {data['type']!r}; use one of {sorted(_KINDS)}")
    else:
        kind = _CATEGORICAL if values is not None else _CONTINUOUS
    if given in ("bool", "boolean") and values is None:
        values = [True, False]
    default = data.get("default", _MISSING)
    if default is None:
        default = _MISSING  # pydantic's unset default: nothing declared
    if kind in (_CATEGORICAL, _DISCRETE):
        if not isinstance(values, list | tuple) or not values:
            raise SpaceError(f"search_space.{name}: a {kind} parameter needs a non-empty list of values")
        if kind == _DISCRETE and _number_list(values) is None:
            raise SpaceError(f"search_space.{name}: discrete values must be numbers")
        return _Spec(name, kind, values=tuple(sorted(values) if kind == _DISCRETE else values), default=default)
    low, high = finite_number(data.get("min")), finite_number(data.get("max"))
    if low is None or high is None or low >= high:
        raise SpaceError(f"search_space.{name}: a continuous parameter needs numbers min < max")
    step = finite_number(data.get("step"))
    integer = given in ("int", "integer") or bool(data.get("integer"))
    if integer and step is None:
        step = 1.0
    if step is not None and step <= 0:
        raise SpaceError(f"search_space.{name}: step must be positive")
    return _Spec(name, kind, low=low, high=high, step=step, integer=integer, default=default)


def _number_list(values: Iterable[Any]) -> list[float] | None:
    out = [finite_number(v) for v in values]
    return None if any(v is None or isinstance(o, str) for v, o in zip(out, values, strict=True)) else out


def _spelling(value: Any) -> str:
    plain = _plain(value)
    return (plain if isinstance(plain, str) else json.dumps(plain)).strip().lower()


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
