"""The JSON schema of the thoughts answer, sent as OpenAI's ``response_format`` so that a
server that enforces it (the local model server, vLLM) makes even a small model write what
``parse_thoughts`` reads.

The schema follows the run's search space: exactly G thoughts of exactly
``proposals_per_thought`` proposals; each proposal's ``params`` has every parameter, a
categorical or discrete one as an ``enum`` of its values, a numeric one as a number in its
range (an integer for integer parameters, on the ``step`` grid when the grid is anchored at
0, else with a bounded number of decimals so the model cannot write digits forever).
``predicted_score`` and ``sigma`` are bounded numbers the same way. Each thought's text has
a ``maxLength`` that leaves room in ``thought_length`` tokens for the JSON around it, so a
whole answer fits.

The schema is a format, not a filter: ``parse_thoughts`` and ``choose_proposals`` still check
everything (a provider may ignore the schema)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from flywheel.society.rlp.propose import SpaceError, read_space

NAME = "rlp_thoughts"
CHARS_PER_TOKEN = 3  # prose in a JSON string; English averages about 4 with SmolLM2's tokenizer
MIN_THOUGHT_CHARS = 24
MAX_THOUGHT_CHARS = 1200


def thoughts_schema(
    search_space: Mapping[str, Any],
    *,
    n_thoughts: int,
    proposals_per_thought: int,
    thought_length: int,
    scores: Iterable[float] = (),
) -> dict[str, Any]:
    """The schema of ``{"thoughts": [{"thought", "proposals": [{"params", "predicted_score",
    "sigma"}]}]}`` for this space. ``scores``: the run's scores so far (they set the range of
    ``predicted_score``: [0, 1] while they lie in it). SpaceError for an unreadable space."""
    specs = read_space(search_space)
    params = {
        "type": "object",
        "properties": {name: _param(spec) for name, spec in specs.items()},
        "required": list(specs),
        "additionalProperties": False,
    }
    low, high = _score_range([s for s in scores if math.isfinite(s)])
    step = _decimals(high - low, low, high)
    proposal = {
        "type": "object",
        "properties": {
            "params": params,
            "predicted_score": {"type": "number", "minimum": low, "maximum": high, "multipleOf": step},
            "sigma": {"type": "number", "exclusiveMinimum": 0, "maximum": high - low, "multipleOf": step},
        },
        "required": ["params", "predicted_score", "sigma"],
        "additionalProperties": False,
    }
    chars = thought_chars(thought_length, n_thoughts, proposals_per_thought, len(specs))
    thought = {
        "type": "object",
        "properties": {
            "thought": {"type": "string", "minLength": 8, "maxLength": chars},
            "proposals": {
                "type": "array",
                "items": proposal,
                "minItems": proposals_per_thought,
                "maxItems": proposals_per_thought,
            },
        },
        "required": ["thought", "proposals"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"thoughts": {"type": "array", "items": thought, "minItems": n_thoughts, "maxItems": n_thoughts}},
        "required": ["thoughts"],
        "additionalProperties": False,
    }


def thoughts_response_format(
    search_space: Mapping[str, Any],
    *,
    n_thoughts: int,
    proposals_per_thought: int,
    thought_length: int,
    scores: Iterable[float] = (),
) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` carrying :func:`thoughts_schema` (not ``strict``: OpenAI's
    strict mode refuses ``maxLength`` and ``multipleOf``; servers with grammar decoding enforce
    the whole schema anyway). None when the space cannot be read (the step then fails on the
    space, as without a schema)."""
    try:
        schema = thoughts_schema(
            search_space,
            n_thoughts=n_thoughts,
            proposals_per_thought=proposals_per_thought,
            thought_length=thought_length,
            scores=scores,
        )
    except SpaceError:
        return None
    return {"type": "json_schema", "json_schema": {"name": NAME, "schema": schema}}


def thought_chars(thought_length: int, n_thoughts: int, proposals_per_thought: int, n_params: int) -> int:
    """Characters each thought's text may have so that the whole answer fits in
    ``thought_length`` tokens: the JSON around the texts is estimated per proposal (about 18
    tokens plus 8 per parameter) and per thought (10), and the rest is shared out."""
    overhead = 6 + n_thoughts * (10 + proposals_per_thought * (18 + 8 * n_params))
    per_thought = (thought_length - overhead) // n_thoughts
    return max(MIN_THOUGHT_CHARS, min(MAX_THOUGHT_CHARS, per_thought * CHARS_PER_TOKEN))


def _param(spec: Any) -> dict[str, Any]:
    if spec.kind in ("categorical", "discrete"):
        return {"enum": [_json_value(v) for v in spec.values]}
    low, high = spec.low, spec.high
    if spec.integer:
        return {"type": "integer", "minimum": math.ceil(low), "maximum": math.floor(high)}
    step = spec.step
    if not step or not _is_multiple(low, step):
        step = _decimals(high - low, low, high)  # the parser snaps onto the real grid
    return {"type": "number", "minimum": low, "maximum": high, "multipleOf": step}


def _score_range(scores: list[float]) -> tuple[float, float]:
    if not scores or (min(scores) >= 0.0 and max(scores) <= 1.0):
        return 0.0, 1.0
    low, high = min(min(scores), 0.0), max(max(scores), 0.0)
    span = (high - low) or 1.0
    return _round_out(low - span, span, math.floor), _round_out(high + span, span, math.ceil)


def _round_out(x: float, span: float, direction: Any) -> float:
    unit = 10.0 ** math.floor(math.log10(span))
    return float(direction(x / unit) * unit)


def _decimals(span: float, *ends: float) -> float:
    """A power of ten fine enough for four significant digits over ``span`` and to write
    each nonzero end of the range (at most 8 decimals)."""
    exponents = [math.floor(math.log10(span)) - 3] if span > 0 else []
    exponents += [math.floor(math.log10(abs(e))) - 1 for e in ends if e]
    exponent = max(-8, min(exponents, default=-3))
    return float(f"1e{exponent}")


def _is_multiple(x: float, step: float) -> bool:
    k = x / step
    return math.isclose(k, round(k), abs_tol=1e-9)


def _json_value(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
