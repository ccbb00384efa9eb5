"""SAO (arXiv 2510.06652): self-synthetic preference pairs.

Personas -> one prompt per persona -> two responses from the policy model at temperature 0.6
-> the same model ranks them ("ranking: X > Y") -> the reward judge ranks them in both
orders, and a pair is kept only when both orders agree with each other and with the model
-> quality filters (length, near-duplicates) -> records in the trace store's export format.

Public entry points: :class:`SaoConfig`, :func:`run_round`, :func:`run_rounds`,
:class:`SaoDataset` (JSONL import/export, S3 publication) and :class:`RoundStats`."""

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.dataset import DatasetImportError, PublishedDataset, SaoDataset, SaoRecord
from flywheel.society.sao.llm import LiteLlm, Llm, Ranker
from flywheel.society.sao.round import RoundResult, RoundStats, run_round, run_rounds

__all__ = [
    "DatasetImportError",
    "LiteLlm",
    "Llm",
    "PublishedDataset",
    "Ranker",
    "RoundResult",
    "RoundStats",
    "SaoConfig",
    "SaoDataset",
    "SaoRecord",
    "run_round",
    "run_rounds",
]
