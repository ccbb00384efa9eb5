"""Python targets and metrics to try the evaluator with (and that its tests use).

A target is ``fn(input, config)`` returning the output text (or a dict with ``output``
and optionally ``cost_usd``); a custom metric is ``fn(output, expected, input)``
returning a float in [0, 1]."""

from __future__ import annotations

import time
from typing import Any


def echo(input: dict[str, Any], config: dict[str, Any]) -> str:
    """Answer with the input's ``question`` (or ``prompt``), prefixed by ``config.prefix``;
    sleeps ``config.delay_s`` first, to stand in for a slow model."""
    time.sleep(float(config.get("delay_s", 0.0)))
    text = str(input.get("question", input.get("prompt", "")))
    return f"{config.get('prefix', '')}{text}"


def priced_echo(input: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Like :func:`echo`, and reports a cost of ``config.price_usd``."""
    return {"output": echo(input, config), "cost_usd": float(config.get("price_usd", 0.0))}


def fail(input: dict[str, Any], config: dict[str, Any]) -> str:
    """Always raises, to show how a failing target is reported."""
    raise ValueError("this target always fails")


def length_ratio(output: str, expected: dict[str, Any], input: dict[str, Any]) -> float:
    """A custom metric: how close the output's length is to the expected answer's."""
    want = len(str(expected.get("answer", expected.get("output", ""))))
    if want == 0:
        return 1.0 if not output else 0.0
    return max(0.0, 1.0 - abs(len(output) - want) / want)


def convergence_score(
    result: Any, expected: dict[str, Any], params: dict[str, Any], metric: str | None = None
) -> float:
    """A custom evaluator in The Convergence's form (``evaluation.custom_evaluator``): the share
    of ``expected.contains`` words found in the result's text (1.0 for a non-empty result when
    there are none). ``result`` is the target's parsed JSON, or its text."""
    text = result if isinstance(result, str) else _text_of(result)
    words = [str(w).lower() for w in (expected or {}).get("contains", []) or []]
    if not words:
        return 1.0 if text.strip() else 0.0
    return sum(w in text.lower() for w in words) / len(words)


def _text_of(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("content", "text", "output", "message", "choices"):
            if key in value:
                return _text_of(value[key])
        return " ".join(_text_of(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(_text_of(v) for v in value)
    return "" if value is None else str(value)
