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


def require_columns(columns: set[str], kind: str, *alternatives: set[str]) -> None:
    """Raise naming the missing columns unless one of ``alternatives`` is fully present."""
    if any(alt <= columns for alt in alternatives):
        return
    wanted = " or ".join("+".join(sorted(alt)) for alt in alternatives)
    raise ValueError(f"dataset: a {kind} run needs the columns {wanted}; got {sorted(columns) or 'none'}")
