"""One thought's reward as RLPConfig says: information gain from log-probabilities when
``use_logprobs`` and the provider gives them, else the prediction fallback; the result names
the definition used and, after a fallback, why."""

from __future__ import annotations

from collections.abc import Mapping

from flywheel.society.rlp.config import RLPConfig
from flywheel.society.rlp.information_gain import (
    InformationGain,
    LogprobScorer,
    LogprobsUnavailable,
    information_gain,
    prediction_gain,
    render_outcome,
)
from flywheel.society.rlp.thoughts import Thought


async def thought_reward(
    config: RLPConfig,
    *,
    context: str,
    thought: Thought,
    observed: Mapping[str, float],
    scorer: LogprobScorer | None,
    model: str | None = None,
    baseline_mean: float | None = None,
) -> InformationGain:
    """The reward of ``thought`` once its configs' scores are ``observed`` (keyed by
    ``ProposedConfig.key``; the outcome text lists them in that order). ``model``: the served
    reasoning policy (default ``config.model_name``); the baseline is ``config.baseline_model``.
    ``baseline_mean``: the fallback's no-think prediction (e.g. the mean score so far).
    ScoringError (a timeout, a server error, nothing predicted was observed) is left to the
    caller, which records the step as failed."""
    note = None
    if config.use_logprobs and scorer is not None:
        try:
            return await information_gain(
                scorer,
                model=model or config.model_name,
                baseline_model=config.baseline_model,
                context=context,
                thought=thought.text,
                outcome=render_outcome(observed),
            )
        except LogprobsUnavailable as exc:
            note = f"no log-probabilities ({exc}); scored the stated predictions instead"
    elif not config.use_logprobs:
        note = "use_logprobs is off; scored the stated predictions"
    else:
        note = "no log-probability scorer; scored the stated predictions"
    gain = prediction_gain(
        thought.predictions(),
        observed,
        sigmas=thought.sigmas(),
        default_sigma=config.fallback_sigma,
        baseline_mean=baseline_mean,
    )
    gain.notes.insert(0, note)
    return gain
