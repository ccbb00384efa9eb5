"""Optimizer settings (env prefix ``FLYWHEEL_OPTIMIZER_``)."""

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.core.retention import stream_max_age_days
from flywheel.core.run_policy import RunPolicySettings
from flywheel.core.settings import DatabaseSettings, NatsSettings, S3Settings, ServiceSettings


class OptimizerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_OPTIMIZER_", extra="ignore")

    grpc_port: int = Field(50051, ge=0, le=65535)
    # grpcio's thread-pool server: Select decides in the worker thread and never waits on the
    # event loop, about 1.6x the Select/s of grpc.aio on one core (bench/select). "aio" also works.
    grpc_server: Literal["aio", "sync"] = "sync"
    nats: NatsSettings = Field(default_factory=NatsSettings)  # type: ignore[arg-type]
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    s3: S3Settings = Field(default_factory=S3Settings)  # type: ignore[arg-type]
    # Feedback later than this after its decision is dead-lettered as expired.
    feedback_window_s: float = Field(7 * 24 * 3600, gt=0)
    # How often each replica reloads every posterior in full: the reconciliation behind the
    # folds below (it expires window buckets, decays idle endpoints, and bounds how long a lost
    # notification or an endpoint changed on another replica goes unseen).
    refresh_interval_s: float = Field(0.5, gt=0, le=60)
    # Segment snapshots kept per replica (segment_key endpoints), least recently used evicted
    # first; an evicted segment's next Select loads it again (one query).
    max_cached_segments: int = Field(10_000, ge=1)
    # Fold the feedback this replica commits into its cached posteriors right after the commit
    # (README "Posterior freshness"); off, only reads (refresh, reload) change them.
    posterior_fold: bool = True
    # Tell the other replicas each feedback transaction's increments with PostgreSQL NOTIFY, and
    # fold theirs (needs posterior_fold); off, they see each other's feedback at a refresh.
    posterior_notify: bool = True
    # Fold the reward of one of this replica's decisions into its cached posterior as soon as
    # the feedback is published (a plain NATS subscription beside the durable consumer), until
    # the transaction that applies it commits (README "Posterior freshness"; needs posterior_fold).
    posterior_provisional_fold: bool = True
    # Tell the other replicas of those provisional folds on plain NATS, and fold theirs, so a
    # reward reaches every replica before its commit (README "Posterior freshness"; needs
    # posterior_provisional_fold and posterior_notify, whose NOTIFY settles them).
    posterior_peer_fold: bool = True
    # How many of its latest decisions a replica remembers for that (about 150 bytes each).
    provisional_recent_decisions: int = Field(50_000, ge=1, le=10_000_000)
    # The feedback consumer fetches on while a batch is applied, so what arrives meanwhile is in
    # hand when the transaction ends; off (the default: it did not cut the lag on 2 busy cores,
    # README "Feedback lag by stage"), it fetches only between batches.
    feedback_prefetch: bool = False
    # Feedback batches applied at once by one replica (each its own transaction; the dedup by
    # event id and the ordered row locks make that safe); more than one implies the prefetch.
    feedback_max_batches: int = Field(1, ge=1, le=8)
    # A snapshot's rebuild from folds starts at least this long (or twice as long as the last
    # rebuild took) after the previous one started; folds arriving meanwhile share the next one.
    posterior_rebuild_interval_s: float = Field(0.002, ge=0, le=1)
    # Joint posterior draws that estimate the selection probabilities of a snapshot rebuilt from
    # folds (a read uses 4000). Each Select still draws its arm with exactly the probabilities
    # it logs; fewer draws make a rebuild cheaper, so feedback reaches Select sooner.
    posterior_fold_draws: int = Field(1000, ge=100, le=100_000)
    # Those draws are reweighted to each fold while their effective sample size stays above half
    # of them. Below this share, a worker thread draws again ahead, and folds go on reweighting
    # the old draws meanwhile instead of waiting for the new ones; 0: draw only when they no
    # longer serve (a fold then waits for the draw). The same for a segment's draws
    # (segment_cache.py), where a segment that must wait no longer holds up the others.
    posterior_redraw_ahead_ess: float = Field(0.75, ge=0, le=1)
    # How often buffered decisions are written and published.
    decision_flush_interval_s: float = Field(0.02, gt=0, le=5)
    # Decisions made but not yet written (PostgreSQL or NATS slow or away): past this many,
    # Select answers RESOURCE_EXHAUSTED instead of buffering more (bounded memory in an outage).
    decision_log_max_pending: int = Field(10_000, ge=1)
    # At that bound, a Select on a worker thread of the sync server waits this long at most for a
    # flush to make room (never past its deadline, never while flushes fail); 0: refused at once.
    decision_log_room_wait_s: float = Field(1.0, ge=0, le=10)
    # How often the elected replica judges incumbents and canaries.
    lifecycle_interval_s: float = Field(2.0, gt=0)
    # How often the run driver steps each running batch run (fold results, send requests).
    run_tick_s: float = Field(0.5, gt=0, le=60)
    # The largest batch run StartRun accepts (INVALID_ARGUMENT naming the field and the cap):
    # a run's search lives in this process, so its size is bounded before anything is built.
    run_max_population: int = Field(1000, ge=2)
    run_max_generations: int = Field(1000, ge=1)
    run_max_test_cases: int = Field(10_000, ge=1)
    # Candidates x test cases over the whole run (after max_evaluations). The search state
    # grows with it and is saved every step: at 100,000 that cost ~0.6 s per step, at 20,000
    # about a fifth of that.
    run_max_evaluations: int = Field(20_000, ge=1)
    run_max_parallel_workers: int = Field(256, ge=1)
    # What run configs may name: credential variables, callables, hosts (FLYWHEEL_RUN_POLICY_*;
    # the evaluator reads the same, see flywheel.core.run_policy). Refuses by default.
    run_policy: RunPolicySettings = Field(default_factory=RunPolicySettings)

    # Retention (flywheel.optimizer.retention, docs/security-bounds.md): rows older than this
    # are deleted by a sweep every retention_interval_s, in short chunks; 0 keeps forever.
    decision_retention_days: float = Field(90.0, ge=0)
    applied_feedback_retention_days: float = Field(90.0, ge=0)
    run_retention_days: float = Field(180.0, ge=0)
    retention_interval_s: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _retention_keeps_exactly_once(self) -> "OptimizerSettings":
        """Deleting a dedup row while its event could still arrive would apply it twice."""
        day = 86400.0
        window_days = self.feedback_window_s / day
        if 0 < self.decision_retention_days < window_days:
            raise ValueError(
                f"decision_retention_days ({self.decision_retention_days:g}) is shorter than the feedback "
                f"window ({window_days:g} days): feedback inside its window would be refused as unknown"
            )
        stream_days = stream_max_age_days("product.feedback")
        need = max(stream_days, window_days, self.decision_retention_days)
        if self.applied_feedback_retention_days and self.decision_retention_days == 0:
            raise ValueError(
                "applied_feedback_retention_days must be 0 (forever) while decision_retention_days is 0: "
                "a decision kept forever can be sent feedback again, and only its ledger row stops a second apply"
            )
        if self.applied_feedback_retention_days and self.applied_feedback_retention_days < need:
            raise ValueError(
                f"applied_feedback_retention_days ({self.applied_feedback_retention_days:g}) must be 0 (forever) or "
                f">= {need:g}: the FEEDBACK stream's max age ({stream_days:g} days), the feedback window and "
                "decision_retention_days, so a redelivered or resent event is never applied twice"
            )
        return self
