"""SAO settings, named as The Convergence's ``SAOConfig`` names them (``society.learning`` in
the run YAML) plus what Flywheel adds (judging in both orders, seeds, limits)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SaoConfig(BaseModel):
    """One SAO generator's settings. Unknown keys are refused, so a typo in the run YAML
    names the field instead of being ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- The Convergence's SAOConfig fields -------------------------------------------
    n_personas: int = Field(100, ge=1, le=100_000, description="distinct personas (and prompts) per round")
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="sampling temperature of the two responses")
    response_pairs: int = Field(2, ge=2, le=2, description="responses per prompt (the paper ranks two)")
    min_response_length: int = Field(50, ge=0, description="characters; a pair with a shorter response is dropped")
    similarity_threshold: float = Field(
        0.9, gt=0.0, le=1.0, description="MinHash Jaccard at or above which two prompts are near-duplicates"
    )
    quality_filter: bool = Field(True, description="apply the length and near-duplicate filters")
    iterative_rounds: int = Field(3, ge=1, le=100, description="rounds run by run_rounds")
    batch_size: int = Field(10, ge=1, le=1000, description="LLM and judge calls in flight at once")

    # --- Flywheel's additions -----------------------------------------------------------
    seed: int = Field(0, description="persona sampling seed: the same seed gives the same personas")
    require_self_agreement: bool = Field(
        True, description="keep a pair only when the reward judge picks the same winner as the model's own ranking"
    )
    judge_rubric: str = Field("", description="reward judge rubric name ('' = the judge's default)")
    judge_min_margin: float = Field(
        0.0, ge=0.0, lt=1.0, description="a judge order prefers a response only by more than this score margin"
    )
    validation_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="prompts held out for validation")
    max_persona_tokens: int = Field(120, ge=8, le=4096)
    max_prompt_tokens: int = Field(128, ge=8, le=4096)
    max_response_tokens: int = Field(384, ge=8, le=16384)
    max_ranking_tokens: int = Field(256, ge=8, le=4096)
    llm_timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="one LLM call's time limit")
    minhash_permutations: int = Field(128, ge=16, le=1024)
    shingle_words: int = Field(3, ge=1, le=10, description="words per shingle for MinHash")
