"""RLP (arXiv 2510.01265) for the society: thoughts with score predictions, their reward as
information gain measured from token log-probabilities, group advantages and GAE.

Torch-free: log-probabilities come from a model server over HTTP (``/v1/completions`` with
``echo`` and ``logprobs``, as the local model server and vLLM answer it)."""

from flywheel.society.rlp.advantages import RewardNormalizer, gae, group_advantages
from flywheel.society.rlp.config import RLPConfig
from flywheel.society.rlp.information_gain import (
    InformationGain,
    LogprobScorer,
    LogprobsUnavailable,
    OutcomeScore,
    ScoringError,
    information_gain,
    prediction_gain,
    render_outcome,
)
from flywheel.society.rlp.reward import thought_reward
from flywheel.society.rlp.thoughts import ParseResult, ProposedConfig, Thought, build_prompt, parse_thoughts

__all__ = [
    "InformationGain",
    "LogprobScorer",
    "LogprobsUnavailable",
    "OutcomeScore",
    "ParseResult",
    "ProposedConfig",
    "RLPConfig",
    "RewardNormalizer",
    "ScoringError",
    "Thought",
    "build_prompt",
    "gae",
    "group_advantages",
    "information_gain",
    "parse_thoughts",
    "prediction_gain",
    "render_outcome",
    "thought_reward",
]
