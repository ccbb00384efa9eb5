"""Alembic environment of the reward judge (tables in flywheel.reward_judge.models)."""

from flywheel.core.migrations import run_env
from flywheel.reward_judge.models import JudgeBase

run_env(JudgeBase.metadata)
