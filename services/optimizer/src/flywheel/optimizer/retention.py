"""Retention of the optimizer's append-only tables (settings ``*_RETENTION_DAYS``).

- ``decisions``: Selects older than ``decision_retention_days``. Off-policy evaluation only
  sees decisions inside that window, and feedback for a deleted decision is refused as
  unknown, which is why the setting may not be shorter than the feedback window.
- ``applied_feedback``: the exactly-once ledger of feedback event ids. Kept at least as long
  as the decisions, the feedback window and the FEEDBACK stream's max age (enforced by
  OptimizerSettings), so a redelivered or resent event still finds its row, or finds its
  decision gone and is refused: never applied twice.
- ``runs`` that finished (succeeded, failed, cancelled) longer ago than
  ``run_retention_days``, with their candidates, requests, evaluations and injections
  (ON DELETE CASCADE; a few runs per chunk since each cascades to many rows). Their
  result files in the object store are not touched.
"""

from __future__ import annotations

from flywheel.core.retention import Rule
from flywheel.optimizer.settings import OptimizerSettings


def rules(settings: OptimizerSettings) -> list[Rule]:
    """The optimizer's retention rules under these settings."""
    return [
        Rule("decisions", "created_at", settings.decision_retention_days),
        Rule("applied_feedback", "applied_at", settings.applied_feedback_retention_days),
        Rule(
            "runs",
            "updated_at",
            settings.run_retention_days,
            where="state IN ('succeeded', 'failed', 'cancelled')",
            chunk=5,
        ),
    ]
