"""Evaluator settings (env prefix ``FLYWHEEL_EVALUATOR_``)."""

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.core.link_settings import JudgeLink
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.settings import ClientLinks, NatsSettings, ServiceSettings


class EvaluatorSettings(JudgeLink, ClientLinks, ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_EVALUATOR_", extra="ignore")
    LINKS: ClassVar[tuple[str, ...]] = ("judge",)

    grpc_port: int = Field(50052, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    # What requests may name: credential variables, callables, hosts (FLYWHEEL_RUN_POLICY_*;
    # the optimizer reads the same, see flywheel.core.run_policy). Refuses by default.
    policy: RunPolicySettings = Field(default_factory=RunPolicySettings)

    # Evaluations in flight at once in this replica (each holds one unacked request).
    concurrency: int = Field(4, ge=1, le=256)
    # Per-call timeout of a target when the request does not set one.
    call_timeout_s: float = Field(30.0, gt=0)
    # Calls per evaluation (1 + retries) on timeouts, connection errors, 429 and 5xx.
    max_attempts: int = Field(3, ge=1, le=10)
    # First retry delay; doubles each retry, with jitter.
    retry_backoff_s: float = Field(0.5, ge=0)
    # Overrides the catalogue's ack wait of evaluator-requests (how soon a crashed
    # replica's requests are redelivered); in-flight requests are kept alive at a third of it.
    ack_wait_s: float | None = Field(None, gt=0)
    # The reward judge link (flywheel.core.link_settings) for llm_judge metrics; with no
    # judge_address, llm_judge is left out of the score with the reason in metric_errors.
    judge_timeout_s: float = Field(30.0, gt=0)
    # Latency (ms) and cost (USD) that score 0 when a metric sets no target.
    latency_target_ms: float = Field(10_000.0, gt=0)
    cost_target_usd: float = Field(0.01, gt=0)
    # Name of this replica in result and trace sources; empty: hostname-pid.
    replica_id: str = ""
