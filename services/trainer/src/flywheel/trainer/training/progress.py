"""Progress reports and cancellation for a running trainer, through callables the caller owns
(the job runner turns reports into TRAINER_EVENTS and answers ``should_stop`` from CancelJob)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from transformers import TrainerCallback

# Where each TRL trainer logs its reward figure: GRPO/RLOO the mean reward, DPO/KTO the implicit
# reward margin (chosen minus rejected), the reward model the score margin.
REWARD_KEYS = ("reward", "rewards/margins", "margin", "rewards/chosen")


@dataclass(frozen=True)
class Progress:
    """One optimizer step, as reported to the caller."""

    step: int
    max_steps: int
    loss: float | None
    reward: float | None
    kl: float | None
    learning_rate: float | None
    tokens_per_s: float | None
    eta_s: float | None
    flat_groups: int | None  # GRPO/RLOO: groups so far whose completions all got the same reward
    groups: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick(logs: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = logs.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return None


class ProgressCallback(TrainerCallback):
    """Reports every logged step through ``on_progress`` and stops the run when ``should_stop()``
    turns true: checked at each step's end, the trainer then saves a checkpoint and stops."""

    def __init__(
        self,
        on_progress: Callable[[Progress], None] | None,
        should_stop: Callable[[], bool] | None,
        reward: Any = None,
    ) -> None:
        self.on_progress = on_progress
        self.should_stop = should_stop
        self.reward = reward  # a WeightedReward for GRPO/RLOO, for the flat-group count
        self.stopped = False
        self.reports: list[Progress] = []
        self._t0 = time.monotonic()
        self._first_step = 0
        self._last: tuple[float, float] | None = None  # (time, tokens) at the previous report

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t0 = time.monotonic()
        self._first_step = state.global_step  # > 0 when resumed: the ETA counts this run's pace only
        self._last = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.should_stop is not None and not self.stopped and self.should_stop():
            self.stopped = True
            control.should_save = True  # the checkpoint first: the job resumes from it
            control.should_training_stop = True
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:  # the end-of-training summary has train_loss, not loss
            return
        now = time.monotonic()
        tokens = pick(logs, ("num_tokens",))
        if tokens is None and state.num_input_tokens_seen:
            tokens = float(state.num_input_tokens_seen)
        tokens_per_s = None
        if tokens is not None:
            since, before = self._last if self._last is not None else (self._t0, None)
            if before is not None and tokens >= before and now > since:
                tokens_per_s = (tokens - before) / (now - since)
            elif before is None and now > since and self._first_step == 0:
                tokens_per_s = tokens / (now - since)
            self._last = (now, tokens)
        done = state.global_step - self._first_step
        eta = (now - self._t0) / done * (state.max_steps - state.global_step) if done > 0 else None
        report = Progress(
            step=state.global_step,
            max_steps=state.max_steps,
            loss=pick(logs, ("loss",)),
            reward=pick(logs, REWARD_KEYS),
            kl=pick(logs, ("kl",)),
            learning_rate=pick(logs, ("learning_rate",)),
            tokens_per_s=tokens_per_s,
            eta_s=eta,
            flat_groups=self.reward.flat_groups if self.reward is not None else None,
            groups=self.reward.groups if self.reward is not None else None,
        )
        self.reports.append(report)
        if self.on_progress is not None:
            self.on_progress(report)
