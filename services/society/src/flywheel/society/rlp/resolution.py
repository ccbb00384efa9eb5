"""Resolving an RLP step once its generation's results are in (pure functions: no I/O).

A proposal is matched to the candidate the optimizer made of it by ``params_key`` (the
optimizer snaps configs onto its space and gives numbers back as doubles, so raw JSON would
not compare). Its observed score is the candidate's mean score; it is a hit when that beats
the median of every evaluated candidate of the candidate's generation. A thought's observed
outcome is the scores of those of its proposals that were evaluated, keyed as its
predictions are (``ProposedConfig.key``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flywheel.society.rlp.advantages import gae
from flywheel.society.rlp.context import params_key
from flywheel.society.rlp.thoughts import ProposedConfig, Thought


@dataclass(frozen=True)
class Observed:
    """What the run measured of one config."""

    score: float
    generation: int
    median: float | None  # of the evaluated candidates of that generation
    cases: int

    @property
    def hit(self) -> bool | None:
        return None if self.median is None else self.score > self.median


@dataclass
class Resolution:
    """The step's outcome: ``ready`` False while a proposal is still being raced."""

    ready: bool
    observed: dict[str, Observed] = field(default_factory=dict)  # by params_key
    thoughts: list[dict[str, float]] = field(default_factory=list)  # per thought: ProposedConfig.key -> score
    waiting: list[str] = field(default_factory=list)


def thoughts_from_json(raw: Sequence[Mapping[str, Any]]) -> list[Thought]:
    """The step's stored thoughts back as ``Thought`` objects."""
    out = []
    for t in raw:
        props = [
            ProposedConfig(dict(p["params"]), float(p["predicted_score"]), p.get("sigma"))
            for p in t.get("proposals", [])
        ]
        out.append(Thought(str(t.get("text", "")), props))
    return out


def thoughts_to_json(thoughts: Sequence[Thought]) -> list[dict[str, Any]]:
    return [
        {
            "text": t.text,
            "proposals": [
                {"params": p.params, "predicted_score": p.predicted_score, "sigma": p.sigma, "key": p.key}
                for p in t.proposals
            ],
        }
        for t in thoughts
    ]


def generation_medians(candidates: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Median mean-score per generation over the candidates evaluated at least once."""
    by_gen: dict[int, list[float]] = {}
    for c in candidates:
        if int(c.get("cases", 0)) > 0:
            by_gen.setdefault(int(c["generation"]), []).append(float(c["score"]))
    return {g: statistics.median(v) for g, v in by_gen.items()}


def resolve(
    thoughts: Sequence[Thought],
    sent: Sequence[Mapping[str, Any]],
    candidates: Sequence[Mapping[str, Any]],
    *,
    current_generation: int,
    finished: bool,
    step_generation: int = 0,
) -> Resolution:
    """Match the step's configs to the run's candidates. ``sent``: the proposals published
    (their ``config``); the step waits (``ready`` False) while one of them sits in a generation
    that is still running, unless the run has finished. Candidates of generations before the
    step's were in its context (their scores shown): a thought naming one is not rewarded for
    repeating what it was told."""
    medians = generation_medians(candidates)
    by_key: dict[str, Mapping[str, Any]] = {}
    for c in candidates:
        if int(c["generation"]) >= step_generation:
            by_key.setdefault(params_key(c.get("params") or {}), c)
    res = Resolution(ready=True)
    if not finished:
        for p in sent:
            found = by_key.get(params_key(p["config"]))
            if found is not None and int(found["generation"]) >= current_generation:
                res.waiting.append(params_key(p["config"]))
        if res.waiting:
            res.ready = False
            return res
    for thought in thoughts:
        seen: dict[str, float] = {}
        for p in thought.proposals:
            k = params_key(p.params)
            match = by_key.get(k)
            if match is None or int(match.get("cases", 0)) <= 0:
                continue
            gen = int(match["generation"])
            if gen >= current_generation and not finished:
                continue  # not sent by this step, and still being raced: not an outcome yet
            res.observed[k] = Observed(float(match["score"]), gen, medians.get(gen), int(match["cases"]))
            seen[p.key] = float(match["score"])
        res.thoughts.append(seen)
    return res


def step_gae(step_rewards: Sequence[float], *, gamma: float, gae_lambda: float, done: bool) -> list[float]:
    """GAE over a run's rewarded steps in generation order. A step's reward is the mean
    normalised reward of its thoughts; the value baseline is 0, the normaliser's running mean
    (rewards are centred by it), so A_t = sum_k (gamma*lambda)^k r_{t+k}. ``done``: the run
    has finished (no value beyond the last step)."""
    if not step_rewards:
        return []
    advantages, _ = gae(list(step_rewards), [0.0] * len(step_rewards), gamma=gamma, gae_lambda=gae_lambda, done=done)
    return advantages
