"""Asking a reasoning model for G thoughts, each followed by configs it proposes and the
scores it predicts for them, and reading its answer.

The answer is JSON (``{"thoughts": [{"thought", "proposals": [{"params", "predicted_score",
"sigma"}]}]}``); ``parse_thoughts`` finds it in prose or code fences, drops thoughts that are
not usable (saying why) and never raises: prose, nothing, or malformed JSON come back as a
``ParseResult`` with ``failure`` set to the reason."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flywheel.society.rlp.information_gain import config_key

SYSTEM = (
    "You tune the configuration of an AI system. Think before you propose: each thought "
    "reasons about the results so far, then proposes configurations and predicts their scores. "
    "Answer with one JSON object and nothing else."
)


@dataclass(frozen=True)
class ProposedConfig:
    """A config a thought proposes, with the score it predicts (and its stated uncertainty)."""

    params: dict[str, Any]
    predicted_score: float
    sigma: float | None = None

    @property
    def key(self) -> str:
        return config_key(self.params)


@dataclass(frozen=True)
class Thought:
    text: str
    proposals: list[ProposedConfig]

    def predictions(self) -> dict[str, float]:
        return {p.key: p.predicted_score for p in self.proposals}

    def sigmas(self) -> dict[str, float | None]:
        return {p.key: p.sigma for p in self.proposals}


@dataclass
class ParseResult:
    """The usable thoughts, or ``failure`` saying why there are too few; ``dropped`` lists
    thoughts left out and why."""

    thoughts: list[Thought] = field(default_factory=list)
    failure: str | None = None
    dropped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None


def build_prompt(
    *,
    history: Sequence[Mapping[str, Any]],
    search_space: Mapping[str, Any],
    n_thoughts: int,
    proposals_per_thought: int = 2,
    metric: str = "score",
    max_history: int = 20,
) -> list[dict[str, str]]:
    """Chat messages asking for ``n_thoughts`` (G ≥ 2) thoughts. ``history``: past evaluations,
    each ``{"params": {...}, "score": float}`` (the best ``max_history`` are shown, best first);
    ``search_space``: parameter name → its range or choices, as the run declares them."""
    if n_thoughts < 2:
        raise ValueError(f"n_thoughts: RLP needs a group of at least 2 thoughts, got {n_thoughts}")
    shown = sorted(history, key=lambda h: -float(h.get(metric, h.get("score", 0.0))))[:max_history]
    lines = [
        f"- {json.dumps(h.get('params', {}), sort_keys=True)} -> {metric} {h.get(metric, h.get('score'))}"
        for h in shown
    ]
    example = {
        "thoughts": [
            {
                "thought": "why these configs should score well, from the results so far",
                "proposals": [{"params": {"<parameter>": "<value>"}, "predicted_score": 0.5, "sigma": 0.1}],
            }
        ]
    }
    user = "\n".join(
        [
            "Search space:",
            json.dumps(dict(search_space), sort_keys=True, default=str),
            "",
            f"Results so far ({len(history)} evaluations, best first; higher {metric} is better):",
            *(lines or ["(none yet)"]),
            "",
            f"Write {n_thoughts} different thoughts. After each, propose {proposals_per_thought} configs "
            f"from the search space and predict the {metric} each will get (predicted_score), with your "
            "uncertainty (sigma, a standard deviation).",
            "Answer with JSON shaped like:",
            json.dumps(example),
        ]
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_thoughts(text: Any, *, min_thoughts: int = 2, max_thoughts: int | None = None) -> ParseResult:
    """Read a reasoning model's answer; never raises. A usable thought has non-empty text and
    at least one proposal with a non-empty ``params`` object and a finite ``predicted_score``
    (``sigma`` optional, positive). Fewer than ``min_thoughts`` usable → ``failure``."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return ParseResult(failure="the model returned nothing")
    if not isinstance(text, str):
        return ParseResult(failure=f"the answer is a {type(text).__name__}, not text")
    try:
        data, problem = _find_json(text)
    except RecursionError:
        return ParseResult(failure="the answer's JSON is nested too deeply")
    if data is None:
        return ParseResult(failure=problem)
    items = data.get("thoughts") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return ParseResult(failure='the JSON has no "thoughts" list')
    result = ParseResult()
    for i, item in enumerate(items):
        thought, why = _thought(item)
        if thought is None:
            result.dropped.append(f"thoughts[{i}]: {why}")
        else:
            result.thoughts.append(thought)
    if max_thoughts is not None and len(result.thoughts) > max_thoughts:
        result.dropped.append(f"{len(result.thoughts) - max_thoughts} thought(s) beyond the {max_thoughts} asked for")
        result.thoughts = result.thoughts[:max_thoughts]
    if len(result.thoughts) < min_thoughts:
        reasons = "; ".join(result.dropped[:3])
        result.failure = f"{len(result.thoughts)} usable thought(s), need {min_thoughts}" + (
            f" ({reasons})" if reasons else ""
        )
    return result


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _find_json(text: str) -> tuple[Any, str]:
    """The first JSON object or array in ``text`` (code fences first), or None and the reason."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    first_error = None
    for chunk in candidates:
        for start, ch in enumerate(chunk):
            if ch not in "{[":
                continue
            try:
                value, _ = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError as exc:
                if first_error is None and ch == "{":
                    first_error = f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                continue
            if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
                return value, ""
    if first_error:
        return None, first_error
    return None, f"no JSON in the answer (prose): {text.strip()[:80]!r}"


def _thought(item: Any) -> tuple[Thought | None, str]:
    if not isinstance(item, dict):
        return None, "not an object"
    words = item.get("thought")
    if not isinstance(words, str) or not words.strip():
        return None, 'no "thought" text'
    raw = item.get("proposals")
    if not isinstance(raw, list) or not raw:
        return None, 'no "proposals" list'
    proposals, why = [], ""
    for j, prop in enumerate(raw):
        parsed, why = _proposal(prop)
        if parsed is None:
            why = f"proposals[{j}]: {why}"
            continue
        proposals.append(parsed)
    if not proposals:
        return None, why
    return Thought(words.strip(), proposals), ""


def _proposal(prop: Any) -> tuple[ProposedConfig | None, str]:
    if not isinstance(prop, dict):
        return None, "not an object"
    params = prop.get("params")
    if not isinstance(params, dict) or not params:
        return None, 'no "params" object'
    score = finite_number(prop.get("predicted_score"))
    if score is None:
        return None, f"predicted_score is not a finite number ({prop.get('predicted_score')!r})"
    sigma = finite_number(prop.get("sigma"))
    if sigma is not None and sigma <= 0:
        sigma = None  # a non-positive spread means nothing; the default applies
    return ProposedConfig(dict(params), score, sigma), ""


def finite_number(value: Any) -> float | None:
    """A finite float from a number or numeric string (bools and NaN/inf are not numbers)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None
