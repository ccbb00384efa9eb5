"""LoRA settings chosen from the model's own architecture rather than a list of names written
for one model family (GPT-2's ``c_attn`` means nothing to a Llama)."""

from __future__ import annotations

from typing import Any

from flywheel.trainer.training.spec import LoraSettings


def block_linear_names(model: Any) -> list[str]:
    """The names of every linear layer inside the model's repeated blocks (attention and MLP
    projections): modules whose path runs through a layer index, so heads and embeddings,
    which sit outside the blocks, are left alone."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    names: set[str] = set()
    for path, module in model.named_modules():
        if not isinstance(module, (nn.Linear, Conv1D)):
            continue
        parts = path.split(".")
        if any(part.isdigit() for part in parts[:-1]):
            names.add(parts[-1])
    if not names:
        raise ValueError(f"{type(model).__name__}: no linear layers inside repeated blocks to put LoRA on")
    return sorted(names)


def head_names(model: Any) -> list[str]:
    """Top-level linear children beside the backbone: a sequence classifier's new score head,
    which must be trained in full (saved with the adapter), not adapted."""
    from torch import nn

    return [
        name for name, child in model.named_children() if child is not model.base_model and isinstance(child, nn.Linear)
    ]


def lora_config(model: Any, settings: LoraSettings, *, reward_model: bool = False) -> Any:
    """A PEFT LoraConfig for ``model``: causal LM, or sequence classification with the score
    head in ``modules_to_save`` for a reward model."""
    from peft import LoraConfig, TaskType

    targets = list(settings.target_modules) if settings.target_modules else block_linear_names(model)
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        task_type=TaskType.SEQ_CLS if reward_model else TaskType.CAUSAL_LM,
        modules_to_save=head_names(model) if reward_model else None,
    )
