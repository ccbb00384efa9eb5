"""What every trainer kind module receives, and the TrainingArguments they share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.trainer.training.spec import TrainSpec


@dataclass
class Context:
    """A run's inputs, ready for a TRL trainer."""

    spec: TrainSpec
    model: Any
    tokenizer: Any
    dataset: Any  # datasets.Dataset
    peft_config: Any
    callbacks: list[Any]
    checkpoints: Path
    device: str
    reward: Any = None  # WeightedReward for GRPO/RLOO

    def args(self, **kind_specific: Any) -> dict[str, Any]:
        """TrainingArguments fields common to all kinds, plus the kind's own. One code path for
        CPU and GPU: bf16, activation (gradient) checkpointing and :meth:`gpu_speedups` switch
        on with CUDA."""
        cuda = self.device.startswith("cuda")
        spec = self.spec
        return {
            "output_dir": str(self.checkpoints),
            "max_steps": spec.max_steps,
            "learning_rate": spec.learning_rate,
            "per_device_train_batch_size": spec.batch_size,
            "gradient_accumulation_steps": spec.gradient_accumulation_steps,
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": spec.save_steps,
            "report_to": "none",
            "disable_tqdm": True,
            "bf16": cuda,
            "activation_checkpointing": cuda,  # transformers 5 name of gradient checkpointing
            "use_cpu": not cuda,
            "seed": spec.seed,
            "dataloader_num_workers": 0,
            **(self.gpu_speedups() if cuda else {}),
            **kind_specific,
        }

    def gpu_speedups(self) -> dict[str, Any]:
        """What TRL 1.16 offers on a GPU beyond bf16 and checkpointing, where it applies.

        - Liger's Triton kernels (RMSNorm, RoPE, SwiGLU...) when ``liger_kernel`` is installed
          (it is not a dependency; without it nothing changes). GRPO/RLOO/DPO/KTO keep their own
          fused LM head, so TRL turns Liger's fused cross-entropy off for them.
        - Padding-free SFT batches (sequences packed best-fit, no pad tokens) when the model runs
          FlashAttention, which is what keeps packed sequences from attending to each other.
          DPO's padding_free is disabled in TRL 1.16 (it warns and pads), so it is not set.
        - Chunked log-probs need no switch: TRL 1.16's SFT, DPO, KTO, GRPO and RLOO trainers
          compute per-token log-probs through a fused, chunked LM head already."""
        import importlib.util

        extra: dict[str, Any] = {}
        if importlib.util.find_spec("liger_kernel") is not None:
            extra["use_liger_kernel"] = True
        attention = str(getattr(self.model.config, "_attn_implementation", "") or "")
        if self.spec.kind == "sft" and attention.startswith("flash_attention"):
            extra.update(padding_free=True, packing=True, packing_strategy="bfd")
        return extra

    def trainer(self, trainer_cls: Any, args: Any, **kind_specific: Any) -> Any:
        """A TRL trainer of ``trainer_cls`` over this run's model, data, adapter and callbacks."""
        return trainer_cls(
            model=self.model,
            args=args,
            train_dataset=self.dataset,
            processing_class=self.tokenizer,
            peft_config=self.peft_config,
            callbacks=self.callbacks,
            **kind_specific,
        )

    def beta(self, default: float) -> float:
        """The spec's KL/preference coefficient, or the kind's default."""
        return self.spec.beta if self.spec.beta is not None else default


def build_online(
    ctx: Context,
    config_cls: Any,
    trainer_cls: Any,
    *,
    default_beta: float,
    config_extra: dict[str, Any] | None = None,
    **trainer_extra: Any,
) -> Any:
    """GRPO and RLOO: the same sampling settings and weighted reward, their own advantage.
    ``config_extra`` / ``trainer_extra``: GRPO's multi-turn settings and hooks."""
    spec = ctx.spec
    args = config_cls(
        **ctx.args(
            # TRL's batch counts completions: batch_size prompts x num_generations each.
            per_device_train_batch_size=spec.batch_size * spec.num_generations,
            num_generations=spec.num_generations,
            max_completion_length=spec.max_completion_length,
            temperature=spec.temperature,
            beta=ctx.beta(default_beta),
            log_completions=False,
            **(config_extra or {}),
        )
    )
    return ctx.trainer(trainer_cls, args, reward_funcs=[ctx.reward], **trainer_extra)


def require_columns(columns: set[str], kind: str, *alternatives: set[str]) -> None:
    """Raise naming the missing columns unless one of ``alternatives`` is fully present."""
    if any(alt <= columns for alt in alternatives):
        return
    wanted = " or ".join("+".join(sorted(alt)) for alt in alternatives)
    raise ValueError(f"dataset: a {kind} run needs the columns {wanted}; got {sorted(columns) or 'none'}")
