"""The training library: LoRA training of every kind the trainer runs (reward model, SFT, DPO,
KTO, GRPO, RLOO) on TRL, from a local base model, with progress, cancellation and resume.
No queue or gRPC here: the job runner calls :func:`train`."""

from flywheel.trainer.training.progress import Progress
from flywheel.trainer.training.rewards import exact_match
from flywheel.trainer.training.run import TrainResult, check_dataset, train
from flywheel.trainer.training.spec import KINDS, LoraSettings, RewardFunction, TrainSpec

__all__ = [
    "KINDS",
    "LoraSettings",
    "Progress",
    "RewardFunction",
    "TrainResult",
    "TrainSpec",
    "check_dataset",
    "exact_match",
    "train",
]
