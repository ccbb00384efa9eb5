"""RLP settings, with The Convergence's ``RLPConfig`` field names (``model_name``,
``thought_length``, ``temperature``, ``buffer_size``, ``gamma``, ``gae_lambda``,
``normalize_rewards``, ``use_logprobs``), ``rlp_enabled`` from its ``society.learning``, the
paper's ``ema_decay`` (τ = 0.999), and what Flywheel adds (named below)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RLPConfig(BaseModel):
    """Settings of RLP for one run (``society.learning`` in the run YAML). Unknown fields are
    refused, so a misspelt setting is an error naming it rather than a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rlp_enabled: bool = False
    # The Convergence's fields.
    model_name: str = Field("smollm2-135m-instruct", min_length=1, description="reasoning model (served name)")
    thought_length: int = Field(500, ge=16, le=8192, description="max tokens for the thoughts answer")
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    buffer_size: int = Field(10_000, ge=1, description="experience buffer capacity")
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="GAE discount over generations")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    normalize_rewards: bool = True
    use_logprobs: bool = Field(True, description="information gain from token log-probabilities when available")
    # The paper's EMA teacher rate; the teacher is not built yet (the baseline is the adapter-free base).
    ema_decay: float = Field(0.999, ge=0.0, lt=1.0)
    # Flywheel's.
    num_thoughts: int = Field(4, ge=2, le=16, description="G: thoughts per generation (the group)")
    proposals_per_thought: int = Field(2, ge=1, le=16)
    baseline: Literal["base_model"] = Field(
        "base_model", description="no-think baseline: the adapter-free base model given the context alone"
    )
    base_model_name: str | None = Field(None, description="served name of the baseline (default: model_name)")
    fallback_sigma: float = Field(0.1, gt=0.0, description="sigma for a prediction that states none")
    timeout_s: float = Field(60.0, gt=0.0)

    @property
    def baseline_model(self) -> str:
        """The served model the no-think baseline is scored with."""
        return self.base_model_name or self.model_name
