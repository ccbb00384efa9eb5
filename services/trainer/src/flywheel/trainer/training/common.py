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
        CPU and GPU: bf16 and activation (gradient) checkpointing switch on with CUDA."""
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
            **kind_specific,
        }

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


def build_online(ctx: Context, config_cls: Any, trainer_cls: Any, *, default_beta: float) -> Any:
    """GRPO and RLOO: the same sampling settings and weighted reward, their own advantage."""
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
        )
    )
    return ctx.trainer(trainer_cls, args, reward_funcs=[ctx.reward])


def require_columns(columns: set[str], kind: str, *alternatives: set[str]) -> None:
    """Raise naming the missing columns unless one of ``alternatives`` is fully present."""
    if any(alt <= columns for alt in alternatives):
        return
    wanted = " or ".join("+".join(sorted(alt)) for alt in alternatives)
    raise ValueError(f"dataset: a {kind} run needs the columns {wanted}; got {sorted(columns) or 'none'}")
