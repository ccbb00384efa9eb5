"""RLOO: like GRPO, with each completion's baseline the mean reward of the other completions of
its prompt (leave-one-out). TRL's default KL coefficient (0.05) is kept unless beta is given."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, build_online, require_columns

DEFAULT_BETA = 0.05


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "rloo", {"prompt"})


def build(ctx: Context) -> Any:
    from trl import RLOOConfig, RLOOTrainer

    return build_online(ctx, RLOOConfig, RLOOTrainer, default_beta=DEFAULT_BETA)
