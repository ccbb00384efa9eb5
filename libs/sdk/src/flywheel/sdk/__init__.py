"""What a product imports to use Flywheel: choose a config per request, report feedback.

- ``FlywheelClient`` (async) and ``SyncFlywheelClient``: ``select``, ``feedback`` (NATS),
  ``feedback_nowait`` + ``flush_feedback`` (NATS, bounded background publishing),
  ``update`` (gRPC), ``decide`` (select, time the block, report once).
- ``flywheel.sdk.convergence``: The Convergence's ``configure_runtime``, ``runtime_select``
  and ``runtime_update`` on Flywheel.
- ``flywheel.sdk.tracing``: ``trace``, span helpers and ``instrument`` (agent traces to the trace store).
- ``flywheel.sdk.admin`` and the ``flywheel`` command (``flywheel.sdk.cli``): endpoints from
  YAML files, their posteriors, and off-policy evaluation.
"""

from flywheel.sdk.client import FlywheelClient
from flywheel.sdk.decision import Decision, DecisionContext
from flywheel.sdk.feedback_queue import FeedbackQueueFull
from flywheel.sdk.sync import SyncFlywheelClient
from flywheel.sdk.tracing import configure_tracing, instrument, trace

__all__ = [
    "Decision",
    "DecisionContext",
    "FeedbackQueueFull",
    "FlywheelClient",
    "SyncFlywheelClient",
    "configure_tracing",
    "instrument",
    "trace",
]
