"""KTO on unpaired feedback: prompt, completion and a boolean label (thumbs up / down). The KL
term is estimated from mismatched pairs within a batch, so batch_size must be at least 2."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns

DEFAULT_BETA = 0.1


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "kto", {"prompt", "completion", "label"})


def build(ctx: Context) -> Any:
    from trl import KTOConfig, KTOTrainer

    if ctx.spec.batch_size < 2:
        raise ValueError("batch_size: kto needs at least 2 (its KL estimate pairs completions within a batch)")
    args = KTOConfig(**ctx.args(max_length=ctx.spec.max_length, beta=ctx.beta(DEFAULT_BETA)))
    return ctx.trainer(KTOTrainer, args)
