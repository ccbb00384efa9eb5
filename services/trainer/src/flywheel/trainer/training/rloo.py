"""RLOO: like GRPO, with each completion's baseline the mean reward of the other completions of
its prompt (leave-one-out). TRL's default KL coefficient (0.05) is kept unless beta is given."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns

DEFAULT_BETA = 0.05


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "rloo", {"prompt"})


def build(ctx: Context) -> Any:
    from trl import RLOOConfig, RLOOTrainer

    spec = ctx.spec
    beta = spec.beta if spec.beta is not None else DEFAULT_BETA
    args = RLOOConfig(
        **ctx.args(
            per_device_train_batch_size=spec.batch_size * spec.num_generations,
            num_generations=spec.num_generations,
            max_completion_length=spec.max_completion_length,
            temperature=spec.temperature,
            beta=beta,
            log_completions=False,
        )
    )
    return RLOOTrainer(
        model=ctx.model,
        reward_funcs=[ctx.reward],
        args=args,
        train_dataset=ctx.dataset,
        processing_class=ctx.tokenizer,
        peft_config=ctx.peft_config,
        callbacks=ctx.callbacks,
    )
