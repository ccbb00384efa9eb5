"""Alembic environment of the trainer (tables in flywheel.trainer.registry.models)."""

from flywheel.core.migrations import run_env
from flywheel.trainer.registry.models import TrainerBase

run_env(TrainerBase.metadata)
