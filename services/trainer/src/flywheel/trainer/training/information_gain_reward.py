"""RLP's information-gain reward (arXiv 2510.01265) for GRPO/RLOO: a completion is a *thought*
``z`` about a prompt (the *context* ``c``), and the dataset's outcome column holds what was
then observed (``x``, as text). The reward of the thought is how much it helps predict the
outcome::

    r(z) = log p_base(x | c, z) - log p_base(x | c)

- ``p_base`` is the **adapter-free base**: the policy being trained with its LoRA adapter
  switched off (``PeftModel.disable_adapter()``), so no second copy of the model is held. The
  paper scores the thought-conditioned term with the current policy and the no-think term with
  an EMA teacher of it (tau = 0.999); here both terms use the frozen base, the first baseline
  issue 16 allows: the reward is how much the thought helps the base model predict the outcome.
- **Text layout**: the context as the policy saw it (a plain prompt as is; a conversation through
  the chat template with the generation prompt), then the thought (trailing whitespace
  stripped), then :data:`SEPARATOR`, then the outcome. The no-think sequence is the same with an
  empty thought, so an empty thought scores exactly 0 (identical token ids are scored once).
- **Tokens**: the prefix (context + thought + separator) and the outcome are tokenised
  separately and their ids concatenated, so the outcome's tokens are the same in both terms and
  the boundary is clean; the sum runs over the outcome's tokens only. Too long: the prefix loses
  tokens from its start (the outcome is kept whole up to ``max_length - 1`` tokens).
- Batched (left padded, explicit position ids, only the outcome's positions go through the LM
  head), without gradients, in eval mode, on the model's own device.

The reward needs the policy model, which exists only once the TRL trainer has wrapped it:
``train()`` calls :meth:`InformationGainReward.bind_trainer` after building the trainer. Every
job here trains a LoRA adapter (there is no full fine-tuning path), so the adapter-free base is
always there; a model without ``disable_adapter`` is refused ("information_gain needs LoRA")."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from flywheel.trainer.training.rewards import completion_text

log = logging.getLogger(__name__)

DEFAULT_OUTCOME_COLUMN = "outcome"
# Between the thought and the outcome, in both terms (the no-think term has an empty thought).
SEPARATOR = "\n"
# Columns TRL keeps from reward functions (it passes them as prompts/completions, or not at all).
RESERVED_COLUMNS = ("prompt", "completion", "completion_ids")


class InformationGainReward:
    """``f(prompts=, completions=, **columns) -> list[float]``: the information gain of each
    completion (thought) about the row's ``outcome_column``, in nats. Call :meth:`bind` (or let
    ``train()`` call :meth:`bind_trainer`) before the first call."""

    def __init__(
        self, outcome_column: str = DEFAULT_OUTCOME_COLUMN, *, batch_size: int = 8, max_length: int = 1024
    ) -> None:
        if not outcome_column:
            raise ValueError("information_gain: outcome_column is empty")
        if outcome_column in RESERVED_COLUMNS:
            raise ValueError(f"information_gain: outcome_column {outcome_column!r} is not a column rewards receive")
        if batch_size < 1 or max_length < 2:
            raise ValueError("information_gain: batch_size >= 1 and max_length >= 2 are needed")
        self.outcome_column = outcome_column
        self.batch_size = batch_size
        self.max_length = max_length
        self.model: Any = None
        self.tokenizer: Any = None
        self.calls = 0
        self.__name__ = f"information_gain_{outcome_column}"

    # -- binding -----------------------------------------------------------------------------
    def bind_trainer(self, trainer: Any) -> None:
        """Score with ``trainer``'s policy (adapter off) and its tokenizer."""
        model = trainer.model
        accelerator = getattr(trainer, "accelerator", None)
        if accelerator is not None:
            model = accelerator.unwrap_model(model)
        self.bind(model, trainer.processing_class)

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Score with ``model`` (a PEFT model: its adapter is switched off while scoring) and
        ``tokenizer`` (a tokenizer or a processor holding one)."""
        if not callable(getattr(model, "disable_adapter", None)):
            raise ValueError(
                f"information_gain needs LoRA: {type(model).__name__} has no adapter to switch off for the"
                " adapter-free base (the no-think baseline)"
            )
        self.model = model
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)

    # -- the reward --------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        if self.outcome_column not in columns:
            raise KeyError(f"information_gain: the dataset has no {self.outcome_column!r} column")
        outcomes = [str(x) for x in columns[self.outcome_column]]
        thoughts = [completion_text(c) for c in completions]
        self.calls += 1
        return list(self.gains(prompts, thoughts, outcomes))

    def gains(self, prompts: Sequence[Any], thoughts: Sequence[str], outcomes: Sequence[str]) -> list[float]:
        """``log p(x | c, z) - log p(x | c)`` for each (context, thought, outcome)."""
        if self.model is None:
            raise RuntimeError("information_gain: not bound to the policy model (train() binds it; or call bind())")
        with_thought, without = [], []
        for prompt, thought, outcome in zip(prompts, thoughts, outcomes, strict=True):
            context = self.context_text(prompt)
            x = self.outcome_ids(outcome)
            with_thought.append(self.sequence(context + thought.rstrip() + SEPARATOR, x))
            without.append(self.sequence(context + SEPARATOR, x))
        scores = self.log_likelihoods([*with_thought, *without])
        n = len(with_thought)
        return [scores[i] - scores[n + i] for i in range(n)]

    def context_text(self, prompt: Any) -> str:
        """The prompt as the policy saw it: text as is, a conversation through the chat template
        with the generation prompt (TRL's rendering for generation)."""
        if isinstance(prompt, list):
            return str(self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        return str(prompt)

    def outcome_ids(self, outcome: str) -> list[int]:
        ids = list(self.tokenizer(text=outcome, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError("information_gain: an outcome has no tokens (empty text)")
        return ids[: self.max_length - 1]

    def sequence(self, prefix: str, outcome_ids: list[int]) -> tuple[tuple[int, ...], int]:
        """(prefix ids + outcome ids, number of outcome tokens); the prefix is left-truncated to
        fit ``max_length``. A rendered chat template carries its own special tokens."""
        special = not prefix.startswith(self.tokenizer.bos_token or "\0")
        ids = list(self.tokenizer(text=prefix, add_special_tokens=special)["input_ids"])
        keep = max(1, self.max_length - len(outcome_ids))
        return tuple(ids[-keep:] + outcome_ids), len(outcome_ids)

    def log_likelihoods(self, sequences: Sequence[tuple[tuple[int, ...], int]]) -> list[float]:
        """Sum of log p(token) over the last ``n`` tokens of each sequence, under the base model
        (adapter off). Identical sequences are scored once."""
        import torch

        unique = sorted(set(sequences), key=lambda s: len(s[0]))  # similar lengths batch together
        scored: dict[tuple[tuple[int, ...], int], float] = {}
        model = self.model
        device = next(model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode(), model.disable_adapter():
                for start in range(0, len(unique), self.batch_size):
                    batch = unique[start : start + self.batch_size]
                    width = max(len(ids) for ids, _ in batch)
                    keep = max(n for _, n in batch) + 1
                    # Left padded: every outcome ends at the last position, so the LM head runs on
                    # the last `keep` positions only (logits_to_keep).
                    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids, _ in batch])
                    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in batch])
                    positions = (mask.cumsum(-1) - 1).clamp(min=0)
                    out = model(
                        input_ids=input_ids.to(device),
                        attention_mask=mask.to(device),
                        position_ids=positions.to(device),
                        logits_to_keep=keep,
                        use_cache=False,
                    )
                    logprobs = out.logits.float().log_softmax(-1)  # (batch, keep, vocab)
                    for row, (ids, n) in enumerate(batch):
                        # The logit at position t predicts token t + 1: the outcome's n tokens are
                        # predicted by kept positions keep-1-n .. keep-2.
                        targets = torch.tensor(ids[-n:], device=logprobs.device)
                        picked = logprobs[row, keep - 1 - n : keep - 1].gather(-1, targets[:, None])
                        scored[(ids, n)] = float(picked.sum())
        finally:
            model.train(was_training)
        return [scored[s] for s in sequences]
