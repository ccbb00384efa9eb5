"""Evaluator settings (env prefix ``FLYWHEEL_EVALUATOR_``)."""

from pydantic import Field, FilePath, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.settings import NatsSettings, ServiceSettings, client_link_problem


class EvaluatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_EVALUATOR_", extra="ignore")

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
    # Reward judge gRPC address (host:port) for llm_judge metrics; empty: llm_judge is
    # left out of the score with the reason in metric_errors.
    judge_address: str = ""
    judge_auth_token: SecretStr | None = None
    judge_timeout_s: float = Field(30.0, gt=0)
    # TLS to the judge: on when judge_tls is true or any judge_tls_* is set (no CA file: the
    # system roots); a cert and key make it mTLS; server_name overrides the name checked in
    # the judge's certificate. The token is sent only over TLS or to loopback, unless
    # judge_allow_insecure.
    judge_tls: bool = False
    judge_tls_ca_file: FilePath | None = None
    judge_tls_cert_file: FilePath | None = None
    judge_tls_key_file: FilePath | None = None
    judge_tls_server_name: str | None = None
    judge_allow_insecure: bool = False
    # Latency (ms) and cost (USD) that score 0 when a metric sets no target.
    latency_target_ms: float = Field(10_000.0, gt=0)
    cost_target_usd: float = Field(0.01, gt=0)
    # Name of this replica in result and trace sources; empty: hostname-pid.
    replica_id: str = ""

    @property
    def judge_tls_on(self) -> bool:
        return self.judge_tls or any(
            (self.judge_tls_ca_file, self.judge_tls_cert_file, self.judge_tls_key_file, self.judge_tls_server_name)
        )

    @model_validator(mode="after")
    def _judge_link(self) -> "EvaluatorSettings":
        var = type(self).env_var
        if (self.judge_tls_cert_file is None) != (self.judge_tls_key_file is None):
            raise ValueError(f"set both {var('judge_tls_cert_file')} and {var('judge_tls_key_file')}, or neither")
        problem = client_link_problem(
            name="reward judge",
            address=self.judge_address,
            token=self.judge_auth_token is not None,
            tls=self.judge_tls_on,
            allow_insecure=self.judge_allow_insecure,
            env={
                "address": var("judge_address"),
                "tls": var("judge_tls"),
                "allow_insecure": var("judge_allow_insecure"),
            },
        )
        if problem:
            raise ValueError(problem)
        return self
