"""Alembic environment of the society (tables in flywheel.society.models)."""

from flywheel.core.migrations import run_env
from flywheel.society.models import SocietyBase

run_env(SocietyBase.metadata)
