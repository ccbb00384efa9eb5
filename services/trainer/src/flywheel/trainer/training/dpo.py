"""Direct preference optimisation on prompt/chosen/rejected triples. With LoRA the reference
model is the base with the adapter switched off, so no second copy is loaded."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns

DEFAULT_BETA = 0.1


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "dpo", {"prompt", "chosen", "rejected"})


def build(ctx: Context) -> Any:
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(**ctx.args(max_length=ctx.spec.max_length, beta=ctx.beta(DEFAULT_BETA)))
    return ctx.trainer(DPOTrainer, args)
