"""The training library: LoRA training of every kind the trainer runs (reward model, SFT, DPO,
KTO, GRPO, RLOO) on TRL, from a local base model, with progress, cancellation and resume.
No queue or gRPC here: the job runner calls :func:`train`.

Names are imported on first use (PEP 562): the trainer's gRPC side reads ``spec`` without
paying for torch and transformers at start."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Progress": "progress",
    "exact_match": "rewards",
    "TrainResult": "run",
    "check_dataset": "run",
    "train": "run",
    "KINDS": "spec",
    "LoraSettings": "spec",
    "MultiTurnSpec": "spec",
    "RewardFunction": "spec",
    "TrainSpec": "spec",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
