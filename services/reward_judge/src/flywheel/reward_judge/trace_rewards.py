"""Rewards computed from a trace's spans, after MassGen's formulas, each with its scale.

MassGen summed a tool reward in [-1, 1], answer quality in [0, 1] and coordination
rewards in about [-1.5, 3] as they came, so the widest scale dominated. Here every
reward declares its native scale and is normalised to [0, 1] before aggregation
(:mod:`flywheel.reward_judge.aggregation`); the raw value is returned beside it.

| reward | raw | scale |
|---|---|---|
| tool_success | mean over tool spans of +1 ok, -0.5 empty result, -1 error | [-1, 1] |
| answer_structure | headings, paragraphs, lists, code | [0, 1] |
| answer_depth | examples, reasons, specifics, length | [0, 1] |
| coordination_rounds | rounds to the final answer (lower is better) | [1, max_rounds] |
| consensus | +1 reached, -0.5 not reached | [-0.5, 1] |
| coordination_tokens | tokens spent by all agents (lower is better) | [0, token_budget] |
| reward:<name> | a reward span's value | its own [reward_min, reward_max] |
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flywheel.reward_judge.aggregation import Aggregate, Method, Signal, aggregate

TOOL_OK, TOOL_EMPTY, TOOL_ERROR = 1.0, -0.5, -1.0
CONSENSUS_YES, CONSENSUS_NO = 1.0, -0.5


@dataclass(frozen=True)
class SpanView:
    """What the rewards read from a span (the protobuf Span, or a MassGen trace entry)."""

    kind: str  # prompt, tool, reward, coordination, content, reasoning
    name: str = ""
    ok: bool = True
    attributes: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    reward: float | None = None
    reward_min: float = 0.0
    reward_max: float = 1.0


@dataclass(frozen=True)
class TraceRewardConfig:
    max_rounds: int = 10
    token_budget: int = 100_000
    weights: dict[str, float] = field(
        default_factory=lambda: {
            "tool_success": 1.0,
            "answer_structure": 0.5,
            "answer_depth": 0.5,
            "coordination_rounds": 0.5,
            "consensus": 1.0,
            "coordination_tokens": 0.25,
        }
    )


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | dict | tuple) and len(value) == 0)


def tool_outcome(span: SpanView) -> float:
    """+1 for a useful result, -0.5 for an empty one, -1 for an error."""
    if not span.ok or span.attributes.get("error"):
        return TOOL_ERROR
    if span.attributes.get("result_empty") is True:
        return TOOL_EMPTY
    if "result" in span.attributes and _is_empty(span.attributes["result"]):
        return TOOL_EMPTY
    return TOOL_OK


def answer_structure(text: str) -> float:
    """[0, 1]: headings, several paragraphs, lists, code blocks (each adds)."""
    if not text.strip():
        return 0.0
    score = 0.0
    if re.search(r"^\s{0,3}#{1,6}\s+\S", text, re.M):
        score += 0.25
    if len([p for p in re.split(r"\n\s*\n", text) if p.strip()]) >= 2:
        score += 0.25
    if len(re.findall(r"^\s*(?:[-*+]|\d+[.)])\s+\S", text, re.M)) >= 2:
        score += 0.3
    if "```" in text or re.search(r"^ {4}\S", text, re.M):
        score += 0.2
    # A single well-formed sentence is some structure, not none.
    return max(score, 0.1)


def answer_depth(text: str) -> float:
    """[0, 1]: examples, reasons, specifics (numbers, names), and enough length."""
    words = re.findall(r"\w+", text)
    if not words:
        return 0.0
    lower = text.lower()
    score = min(len(words), 150) / 150 * 0.4
    if re.search(r"\b(for example|for instance|e\.g\.|such as|example)\b", lower):
        score += 0.2
    if re.search(r"\b(because|therefore|so that|since|which means|this is why)\b", lower):
        score += 0.2
    if re.search(r"\d", text) or re.search(r"`[^`]+`", text):
        score += 0.2
    return min(score, 1.0)


def trace_signals(spans: list[SpanView], answer: str = "", config: TraceRewardConfig | None = None) -> list[Signal]:
    """The rewards a trace supports, each as a Signal with its declared scale."""
    cfg = config or TraceRewardConfig()
    w = cfg.weights
    signals: list[Signal] = []
    tools = [tool_outcome(s) for s in spans if s.kind == "tool"]
    if tools:
        signals.append(Signal("tool_success", sum(tools) / len(tools), -1.0, 1.0, w["tool_success"]))
    if not answer:
        content = [s for s in spans if s.kind == "content" and isinstance(s.attributes.get("text"), str)]
        answer = content[-1].attributes["text"] if content else ""
    if answer:
        signals.append(Signal("answer_structure", answer_structure(answer), 0.0, 1.0, w["answer_structure"]))
        signals.append(Signal("answer_depth", answer_depth(answer), 0.0, 1.0, w["answer_depth"]))
    coordination = [s for s in spans if s.kind == "coordination"]
    if coordination:
        rounds = max(
            [int(s.attributes.get("round", 0) or 0) for s in coordination]
            + [sum(1 for s in coordination if s.attributes.get("event") == "round")]
            + [1]
        )
        signals.append(
            Signal("coordination_rounds", float(rounds), 1.0, float(cfg.max_rounds), w["coordination_rounds"], True)
        )
        reached = any(
            s.attributes.get("consensus") is True or s.attributes.get("event") == "consensus" for s in coordination
        )
        signals.append(
            Signal("consensus", CONSENSUS_YES if reached else CONSENSUS_NO, CONSENSUS_NO, CONSENSUS_YES, w["consensus"])
        )
        tokens = sum(s.tokens for s in spans)
        signals.append(
            Signal("coordination_tokens", float(tokens), 0.0, float(cfg.token_budget), w["coordination_tokens"], True)
        )
    names = {s.name for s in signals}
    for i, s in enumerate(spans):
        if s.kind == "reward" and s.reward is not None:
            lo, hi = (s.reward_min, s.reward_max) if s.reward_max > s.reward_min else (0.0, 1.0)
            name = f"reward:{s.name or i}"
            if name in names:  # two reward spans with one name stay two signals
                name = f"{name}#{i}"
            names.add(name)
            signals.append(Signal(name, s.reward, lo, hi, 1.0))
    return signals


def trace_reward(
    spans: list[SpanView],
    answer: str = "",
    method: Method = Method.WEIGHTED_MEAN,
    config: TraceRewardConfig | None = None,
) -> tuple[Aggregate, list[Signal]]:
    """The trace's total (normalised components combined) and the signals behind it."""
    signals = trace_signals(spans, answer, config)
    return aggregate(signals, method), signals
