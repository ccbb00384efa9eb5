"""Rewards for the online kinds (GRPO, RLOO): weighted Python callables combined into one,
and the count of groups that teach nothing.

A group is the ``num_generations`` completions of one prompt. When all of them get the same
reward their advantages are zero and the step learns nothing from that prompt; TRL trains on
regardless, so the combined reward counts such groups and the run reports the count."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Sequence
from typing import Any

from flywheel.core import text_metrics
from flywheel.trainer.training.spec import RewardFunction

log = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings for plain prompts and a list of messages for
    conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def exact_match(answer_column: str = "answer") -> Any:
    """A verifiable reward: 1.0 when the completion equals the row's ``answer_column`` after the
    evaluator's normalisation (:func:`flywheel.core.text_metrics.exact_match`: case-folded,
    whitespace collapsed, surrounding punctuation stripped), else 0.0."""

    def exact_match_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        if answer_column not in columns:
            raise KeyError(f"exact_match: the dataset has no {answer_column!r} column")
        return [
            text_metrics.exact_match(completion_text(c), str(a))
            for c, a in zip(completions, columns[answer_column], strict=True)
        ]

    return exact_match_reward


class WeightedReward:
    """The spec's reward functions as the single reward TRL calls: the weighted sum of the ones
    that scored a completion (None when none did). Counts flat groups as it goes."""

    __name__ = "reward"  # TRL names the reward in its logs after the callable

    def __init__(self, functions: Sequence[RewardFunction], num_generations: int) -> None:
        self.functions = list(functions)
        self.num_generations = num_generations
        self.groups = 0
        self.flat_groups = 0

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        results = [f.fn(prompts=prompts, completions=completions, **columns) for f in self.functions]
        return self._combine(results, len(completions))

    def _combine(self, results: list[Any], n: int) -> list[float | None]:
        totals: list[float | None] = [None] * n
        for function, raw in zip(self.functions, results, strict=True):
            scores = list(raw)
            if len(scores) != n:
                raise ValueError(f"reward {function.label!r} returned {len(scores)} scores for {n} completions")
            for i, score in enumerate(scores):
                if score is None:
                    continue
                value = float(score)
                if not math.isfinite(value):
                    raise ValueError(f"reward {function.label!r} returned {value} (not finite)")
                previous = totals[i]
                totals[i] = function.weight * value + (previous if previous is not None else 0.0)
        self._count_flat(totals)
        return totals

    def _count_flat(self, totals: list[float | None]) -> None:
        # TRL repeats each prompt num_generations times in a row, so groups are contiguous.
        n = self.num_generations
        flat = 0
        groups = len(totals) // n
        for g in range(groups):
            scored = [t for t in totals[g * n : (g + 1) * n] if t is not None]
            if not scored or max(scored) - min(scored) <= 1e-9:
                flat += 1
        self.groups += groups
        self.flat_groups += flat
        if groups and flat == groups:
            log.warning("all %d groups of this generation got equal rewards: no learning signal", groups)


class AsyncWeightedReward(WeightedReward):
    """The same, when some reward is a coroutine (a judge over the network): TRL awaits this one,
    and the coroutines of one batch run concurrently."""

    async def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:  # type: ignore[override]
        calls = [f.fn(prompts=prompts, completions=completions, **columns) for f in self.functions]
        pending = [i for i, c in enumerate(calls) if inspect.isawaitable(c)]
        done = await asyncio.gather(*(calls[i] for i in pending))
        for i, value in zip(pending, done, strict=True):
            calls[i] = value
        return self._combine(calls, len(completions))


def combined_reward(functions: Sequence[RewardFunction], num_generations: int) -> WeightedReward:
    """The one reward TRL calls: async when any of ``functions`` is."""
    from trl.trainer.utils import is_async_callable

    for f in functions:
        # A group-wise reward (the judge's Rank) judges num_generations completions together:
        # it follows the run's group size, whatever it was built with.
        if isinstance(getattr(f.fn, "num_generations", None), int):
            f.fn.num_generations = num_generations
    if any(is_async_callable(f.fn) for f in functions):
        return AsyncWeightedReward(functions, num_generations)
    return WeightedReward(functions, num_generations)
