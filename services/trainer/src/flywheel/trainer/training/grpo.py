"""GRPO: sample ``num_generations`` completions per prompt, score them with the weighted
rewards, and push towards the better ones within each group. With ``beta > 0`` the KL to the
base model (the adapter switched off) keeps the policy close: RLHF without PPO."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns

# TRL's default is 0 (no reference model); RLHF wants the KL penalty.
DEFAULT_BETA = 0.04


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "grpo", {"prompt"})


def build(ctx: Context) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    spec = ctx.spec
    beta = spec.beta if spec.beta is not None else DEFAULT_BETA
    args = GRPOConfig(
        **ctx.args(
            # TRL's batch counts completions: batch_size prompts x num_generations each.
            per_device_train_batch_size=spec.batch_size * spec.num_generations,
            num_generations=spec.num_generations,
            max_completion_length=spec.max_completion_length,
            temperature=spec.temperature,
            beta=beta,
            log_completions=False,
        )
    )
    return GRPOTrainer(
        model=ctx.model,
        reward_funcs=[ctx.reward],
        args=args,
        train_dataset=ctx.dataset,
        processing_class=ctx.tokenizer,
        peft_config=ctx.peft_config,
        callbacks=ctx.callbacks,
    )
