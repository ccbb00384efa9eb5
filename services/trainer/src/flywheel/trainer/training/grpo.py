"""GRPO: sample ``num_generations`` completions per prompt, score them with the weighted
rewards, and push towards the better ones within each group. With ``beta > 0`` the KL to the
base model (the adapter switched off) keeps the policy close: RLHF without PPO. With
``spec.multi_turn`` each completion is a conversation (:mod:`flywheel.trainer.training.multiturn`)."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, build_online, require_columns

# TRL's default is 0 (no reference model); RLHF wants the KL penalty.
DEFAULT_BETA = 0.04


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "grpo", {"prompt"})


def build(ctx: Context) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    if ctx.spec.multi_turn is None:
        return build_online(ctx, GRPOConfig, GRPOTrainer, default_beta=DEFAULT_BETA)
    from datasets import Dataset

    from flywheel.trainer.training import multiturn

    config_extra, hooks = multiturn.trainer_kwargs(ctx.spec.multi_turn, ctx.tokenizer)
    ctx.dataset = Dataset.from_list(multiturn.conversational_rows(ctx.dataset.to_list()))
    return build_online(ctx, GRPOConfig, GRPOTrainer, default_beta=DEFAULT_BETA, config_extra=config_extra, **hooks)
