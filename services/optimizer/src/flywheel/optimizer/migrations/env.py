"""Alembic environment of the optimizer (tables in flywheel.optimizer.models)."""

from flywheel.core.migrations import run_env
from flywheel.optimizer.models import OptimizerBase

run_env(OptimizerBase.metadata)
