"""What a training run is asked to do: the job kind, the base model, LoRA and the hyperparameters.

Validated at construction (pydantic), so a NaN learning rate or an unknown kind fails before a
model is loaded, with the field named in the error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Kind = Literal["reward_model", "sft", "dpo", "kto", "grpo", "rloo"]
KINDS: tuple[str, ...] = ("reward_model", "sft", "dpo", "kto", "grpo", "rloo")

# A reward for GRPO/RLOO: f(prompts=..., completions=..., **columns) -> one float (or None:
# "cannot score this one") per completion. The dataset's other columns arrive as keyword lists.
RewardCallable = Callable[..., list[float | None]]


class LoraSettings(BaseModel):
    """LoRA adapter shape. ``target_modules`` None: every linear layer of the repeated blocks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    r: int = Field(16, gt=0, le=1024)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    target_modules: tuple[str, ...] | None = None


class RewardFunction(BaseModel):
    """One weighted reward of a GRPO/RLOO run."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    fn: Any
    weight: float = Field(1.0, allow_inf_nan=False)
    name: str | None = None

    @model_validator(mode="after")
    def _callable(self) -> RewardFunction:
        if not callable(self.fn):
            raise ValueError(f"reward function {self.name or self.fn!r} is not callable")
        return self

    @property
    def label(self) -> str:
        return self.name or getattr(self.fn, "__name__", type(self.fn).__name__)


class MultiTurnSpec(BaseModel):
    """GRPO over conversations (see :mod:`flywheel.trainer.training.multiturn`): ``environment``
    is a simulated user ``(history) -> next user message | None``, or an environment factory
    (a class or a no-argument callable) whose objects' public methods are tools."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    environment: Any
    max_turns: int = Field(2, ge=1, le=64, description="most assistant turns per conversation")

    @model_validator(mode="after")
    def _callable(self) -> MultiTurnSpec:
        if not callable(self.environment):
            raise ValueError(f"multi_turn.environment {self.environment!r} is not callable")
        return self


class TrainSpec(BaseModel):
    """A training run. ``batch_size`` counts prompts (or pairs) per optimizer step; GRPO and
    RLOO generate ``num_generations`` completions for each of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    base_model: str = Field(min_length=1, description="'tiny', 'smollm2', a .gguf file or a model folder")
    max_steps: int = Field(gt=0)
    learning_rate: float = Field(1e-4, gt=0, le=1, allow_inf_nan=False)
    batch_size: int = Field(2, gt=0)
    gradient_accumulation_steps: int = Field(1, gt=0)
    max_length: int = Field(512, gt=8)
    save_steps: int = Field(50, gt=0)
    seed: int = 0
    lora: LoraSettings = Field(default_factory=LoraSettings)
    # KL coefficient (DPO/KTO: the preference temperature). None: the kind's default; GRPO's
    # default is raised from TRL's 0 to 0.04, since RLHF needs the pull back to the base model.
    beta: float | None = Field(None, ge=0, allow_inf_nan=False)
    # GRPO / RLOO
    num_generations: int = Field(4, ge=2)
    max_completion_length: int = Field(64, gt=0)
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    rewards: tuple[RewardFunction, ...] = ()
    multi_turn: MultiTurnSpec | None = None  # GRPO only
    device: str = "auto"

    @model_validator(mode="after")
    def _rewards_for_online_kinds(self) -> TrainSpec:
        if self.kind in ("grpo", "rloo") and not self.rewards:
            raise ValueError(f"rewards: a {self.kind} run needs at least one reward function")
        if self.kind not in ("grpo", "rloo") and self.rewards:
            raise ValueError(f"rewards: only grpo and rloo take reward functions, not {self.kind}")
        if self.multi_turn is not None and self.kind != "grpo":
            raise ValueError(f"multi_turn: only grpo runs multi-turn rollouts (TRL's hooks), not {self.kind}")
        return self
