"""Alembic environment of the trace store (tables in flywheel.trace_store.models)."""

from flywheel.core.migrations import run_env
from flywheel.trace_store.models import TraceStoreBase

run_env(TraceStoreBase.metadata)
