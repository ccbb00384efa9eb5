"""Supervised fine-tuning on conversations (messages), prompt/completion pairs (loss on the
completion only) or plain text."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.common import Context, require_columns


def check_columns(columns: set[str]) -> None:
    require_columns(columns, "sft", {"messages"}, {"prompt", "completion"}, {"text"})


def build(ctx: Context) -> Any:
    from trl import SFTConfig, SFTTrainer

    return ctx.trainer(SFTTrainer, SFTConfig(**ctx.args(max_length=ctx.spec.max_length)))
