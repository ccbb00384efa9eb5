"""Trainer settings (env prefix ``FLYWHEEL_TRAINER_``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import ClassVar

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from flywheel.core.link_settings import JudgeLink, OptimizerLink
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.settings import (
    ClientLinks,
    DatabaseSettings,
    NatsSettings,
    S3Settings,
    ServiceSettings,
)


# Links (flywheel.core.link_settings): the reward judge (GRPO/RLOO judge rewards; the win rate
# of a trained policy against its base) and the optimizer (a job naming an endpoint enrols its
# version as a canary arm there; the registry follows the bandit's verdict on that arm).
class TrainerSettings(JudgeLink, OptimizerLink, ClientLinks, ServiceSettings):
    LINKS: ClassVar[tuple[str, ...]] = ("judge", "optimizer")
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_TRAINER_", extra="ignore")

    grpc_port: int = Field(50056, ge=0, le=65535)
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Which callables a job may name (verifiable rewards, multi-turn environments): the same
    # FLYWHEEL_RUN_POLICY_* the optimizer and evaluators read. Refuses every module by default.
    policy: RunPolicySettings = Field(default_factory=RunPolicySettings)
    # Policy events left unpublished (bus down after a change committed) are published again
    # by a sweep every policy_event_sweep_s, once older than policy_event_grace_s.
    policy_event_sweep_s: float = Field(10.0, gt=0)
    policy_event_grace_s: float = Field(5.0, ge=0)

    # -- jobs ---------------------------------------------------------------------------------
    # Run training jobs from the work queue in this replica (false: gRPC and registry only,
    # e.g. a CPU-only control-plane replica beside GPU workers).
    run_jobs: bool = True
    # Scratch space for datasets, base models from S3 and checkpoints of the running job.
    work_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "flywheel" / "trainer")
    # Folders a job may name a local base model under (besides 'tiny', 'smollm2' and s3://
    # prefixes): a caller never makes the trainer read an arbitrary path. Default: the model
    # server's converted-model cache.
    model_roots: list[Path] = Field(default_factory=lambda: [Path.home() / ".cache" / "flywheel" / "models"])
    # The running job's message is marked in progress this often (the consumer's ack_wait is
    # 30 min): a replica killed mid-job has its job redelivered after ack_wait.
    heartbeat_s: float = Field(30.0, gt=0)
    # Overrides the catalogue's ack wait of trainer-jobs (how soon a dead replica's job returns).
    ack_wait_s: float | None = Field(None, gt=0)
    # On SIGTERM the running job saves a checkpoint at its next step and is handed back to the
    # queue; the consumer waits this long for that (set the pod's terminationGracePeriodSeconds
    # above it).
    drain_timeout_s: float = Field(120.0, gt=0)
    # How often a running job checks whether CancelJob was called.
    cancel_poll_s: float = Field(2.0, gt=0)
    # Checkpoint every this many optimizer steps unless the job's hyperparameters say otherwise.
    save_steps: int = Field(50, gt=0)
    # A job picked up this many times (its replica died or was stopped each time) is marked
    # FAILED instead of run again.
    max_attempts: int = Field(5, ge=1, le=20)
    # Name of this replica in job records and progress events; empty: hostname-pid.
    replica_id: str = ""
    # Held-out evaluation after training: prompts judged (policy) / pairs scored (reward model).
    eval_max_samples: int = Field(64, ge=1, le=10_000)
    eval_max_new_tokens: int = Field(64, ge=1, le=4096)
    # Jobs kept in PostgreSQL (finished ones older than this are deleted).
    job_retention_days: float = Field(90.0, gt=0)

    # How often canary versions are compared with their arm's status in the optimizer.
    canary_follow_s: float = Field(5.0, gt=0)
    # Model server (OpenAI-compatible, vLLM's runtime LoRA API) that serves new versions; empty:
    # versions are registered and enrolled but nothing is asked to load them.
    modelserver_url: str = ""
    modelserver_api_key: SecretStr | None = None

    @property
    def worker(self) -> str:
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"
