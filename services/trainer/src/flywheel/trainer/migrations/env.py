"""Alembic environment of the trainer (tables in flywheel.trainer.registry.models and
flywheel.trainer.jobs.models)."""

import flywheel.trainer.jobs.models  # noqa: F401 - registers training_jobs on the metadata
from flywheel.core.migrations import run_env
from flywheel.trainer.registry.models import TrainerBase

run_env(TrainerBase.metadata)
