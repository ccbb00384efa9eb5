"""Society settings (env prefix ``FLYWHEEL_SOCIETY_``).

The reasoning model (RLP) and the policy model (SAO) are reached through LiteLLM with the
``FLYWHEEL_LLM_*`` settings (the local model server offline, any provider in production).
A run's ``society.llm.model`` may only pick one of ``FLYWHEEL_SOCIETY_MODELS``; its key and
base URL always come from these settings, never from the run (a run config cannot choose
which secret the society sends, or where)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.core.link_settings import JudgeLink, OptimizerLink, TraceStoreLink, TrainerLink
from flywheel.core.llm import LlmSettings
from flywheel.core.settings import ClientLinks, DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


# Links to the services the society calls (flywheel.core.link_settings): the optimizer, the
# judge, the trainer, and the trace store, whose endpoint traces SAO mixes real prompts from
# (StartSaoRound.endpoint).
class SocietySettings(OptimizerLink, JudgeLink, TrainerLink, TraceStoreLink, ClientLinks, ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_SOCIETY_", extra="ignore")
    LINKS: ClassVar[tuple[str, ...]] = ("optimizer", "judge", "trainer", "trace_store")

    grpc_port: int = Field(50055, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    llm: LlmSettings = Field(default_factory=LlmSettings)

    # Served model names a run (society.llm.model, learning.rlp.model_name) or StartSaoRound
    # may choose; empty: only FLYWHEEL_LLM_MODEL.
    models: list[str] = Field(default_factory=list)
    # OpenAI-compatible completions API with prompt log-probabilities (the local model server,
    # vLLM) for RLP's information gain; empty: the stated-prediction fallback is used.
    modelserver_url: str = ""
    modelserver_api_key: SecretStr | None = None

    # RLP: the experience buffer's capacity per search space (The Convergence's buffer_size),
    # few-shot examples shown from it, and the GRPO job on it.
    buffer_size: int = Field(10_000, ge=1, le=1_000_000)
    few_shot: int = Field(3, ge=0, le=20)
    # Submit a GRPO job once a space's buffer holds this many experiences (and again after as
    # many new ones); 0 turns RLP training off.
    rlp_train_min_experiences: int = Field(256, ge=0)
    rlp_train_base_model: str = ""  # the trainer's base model id for the reasoning policy
    # A step whose LLM call outlasts this fails ("llm_timeout"); the run does not wait.
    step_timeout_s: float = Field(120.0, gt=0)
    # Send the thoughts' JSON schema as the request's response_format, for servers that
    # enforce it while generating (the local model server, vLLM); see rlp/schema.py.
    rlp_structured_output: bool = True

    # SAO: ask for the policy model's self-ranking as JSON ({"ranking": "A > B" | "B > A"}) with
    # response_format, for servers that enforce it (the local model server, vLLM); see sao/judge.py.
    sao_structured_output: bool = True
    # SAO: submit a preference job when a dataset has at least this many training pairs.
    sao_train_threshold: int = Field(200, ge=1)
    sao_train_base_model: str = ""  # the trainer's base model id for the SAO policy
    sao_train_kind: str = Field("dpo", pattern="^(dpo|simpo)$")
    # Largest ImportDataset payload.
    import_max_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # SAO rounds running at once in this replica.
    sao_concurrency: int = Field(1, ge=1, le=16)
    # Rounds and datasets older than this are deleted (their S3 objects stay for trained lineage).
    retention_days: float = Field(90.0, gt=0)

    def allowed_models(self) -> list[str]:
        """Model names a run or a request may choose."""
        return list(dict.fromkeys([self.llm.model, *self.models]))

    @model_validator(mode="after")
    def _check(self) -> SocietySettings:
        if self.modelserver_url and not self.modelserver_url.startswith(("http://", "https://")):
            raise ValueError(f"{type(self).env_var('modelserver_url')} must start with http:// or https://")
        return self
