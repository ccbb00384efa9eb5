"""Reward model: a one-output scorer trained on chosen/rejected pairs (Bradley-Terry), scored
at the last non-pad token. Optional columns: prompt, margin."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns

REWARD_MODEL = True


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "reward_model", {"chosen", "rejected"})


def build(ctx: Context) -> Any:
    from trl import RewardConfig, RewardTrainer

    return ctx.trainer(RewardTrainer, RewardConfig(**ctx.args(max_length=ctx.spec.max_length)))
