"""Turning feedback into one reward: a scalar wins; otherwise the weighted mean of the
named signals that are present (a missing signal is not a zero).

Measurements the SDK attaches to every decision (``latency_ms``, ``cost_usd``) are not
rewards by themselves: they count only when the endpoint declares a weight for them."""

from __future__ import annotations

MEASUREMENTS = frozenset({"latency_ms", "cost_usd"})


def combine_reward(reward: float | None, signals: dict[str, float], weights: dict[str, float]) -> float:
    """The scalar reward, or the weighted mean of the present signals. With no weights
    declared every signal counts with weight 1; with weights, undeclared signals are ignored."""
    if reward is not None:
        return reward
    present = {k: v for k, v in signals.items() if k in weights or (not weights and k not in MEASUREMENTS)}
    if not present:
        raise ValueError("feedback has no reward and none of the endpoint's signals")
    total_weight = sum(weights.get(k, 1.0) for k in present)
    if total_weight <= 0:
        raise ValueError("signal weights of the present signals sum to zero")
    return sum(v * weights.get(k, 1.0) for k, v in present.items()) / total_weight
