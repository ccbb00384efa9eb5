"""Multi-turn GRPO: conversations of several assistant turns, driven by a simulated user or by
an environment whose methods are tools, through TRL 1.16's own hooks.

Two kinds of driver, told apart by how they are called:

- **simulated user**: ``user(history) -> str | None``, one argument (the conversation so far as
  chat messages, the assistant's last turn included); it returns the next user message, or
  None to end the conversation. Driven here through GRPOTrainer's ``rollout_func``: each
  rollout generates an assistant turn with the policy being trained, asks the user, appends
  the user's message (its tokens masked out of the loss with ``env_mask``), and repeats up to
  ``max_turns`` assistant turns. Generation is the trainer's own model with ``generate``, so it
  runs on the CPU (no vLLM). The reward functions see the whole conversation as the completion,
  and the message list as the ``conversation`` column.
- **environment factory**: a class, or a function of no arguments, returning a fresh environment
  per rollout: ``reset(**row) -> str | None`` and public methods that are the model's tools,
  optionally ``get_reward() -> float``. Passed to GRPOTrainer as ``environment_factory``
  unchanged, with ``max_tool_calling_iterations = max_turns - 1``. TRL renders the tools into
  the prompt with the tokenizer's chat template and parses the model's tool calls with a
  response template, so it needs a chat template that can render a tool-calling conversation
  (Qwen2.5/Qwen3, Llama 3.1+, GPT-OSS, ...). SmolLM2's template (and so ``tiny``'s and
  ``smollm2``'s) cannot: such a run is refused at build time with that reason. This is a
  property of the template, not of the CPU; TRL's tool loop itself runs on the CPU.

Both need conversational prompts; a plain-text ``prompt`` column is turned into one user
message first.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from flywheel.trainer.training.spec import MultiTurnSpec

log = logging.getLogger(__name__)

SIMULATED_USER = "simulated_user"
ENVIRONMENT = "environment"


def from_path(environment: str, max_turns: int, *, policy: Any) -> MultiTurnSpec:
    """A job's ``MultiTurn`` (``module:function`` and max turns, 0 for the default 2) as a spec,
    the path resolved under the run policy (:func:`flywheel.core.callables.resolve_callable`);
    a refused path is a ValueError naming it."""
    from flywheel.core.callables import resolve_callable

    found = resolve_callable(environment, what="multi_turn.environment", policy=policy)
    return MultiTurnSpec(environment=found, max_turns=max_turns or 2)


def driver_kind(environment: Any) -> str:
    """``"environment"`` for a class or a callable of no required arguments (a factory), else
    ``"simulated_user"`` (a callable taking the history)."""
    if inspect.isclass(environment):
        return ENVIRONMENT
    try:
        signature = inspect.signature(environment)
    except (TypeError, ValueError):
        return SIMULATED_USER
    required = [
        p
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return ENVIRONMENT if not required else SIMULATED_USER


def as_conversation(prompt: Any) -> list[dict[str, Any]]:
    """A dataset prompt as chat messages: a string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError(f"multi_turn: prompt must be text or a list of chat messages, got {type(prompt).__name__}")


def conversational_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``prompt`` as chat messages (TRL's tool and rollout paths read conversations)."""
    return [{**row, "prompt": as_conversation(row["prompt"])} for row in rows]


def trainer_kwargs(spec: MultiTurnSpec, tokenizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(GRPOConfig fields, GRPOTrainer keyword arguments) that drive ``spec``'s conversations."""
    if driver_kind(spec.environment) == ENVIRONMENT:
        from trl.chat_template_utils import supports_tool_calling

        if not supports_tool_calling(tokenizer):
            raise ValueError(
                "multi_turn.environment: an environment's methods are tools, and TRL's environment_factory needs a"
                " chat template that can render a tool-calling conversation; this base model's template cannot"
                " (SmolLM2's and tiny's cannot). Use a simulated user (a callable of the history), or a base model"
                " whose template supports tools (Qwen2.5/Qwen3, Llama 3.1+)"
            )
        return {"max_tool_calling_iterations": spec.max_turns - 1}, {"environment_factory": spec.environment}
    return {}, {"rollout_func": SimulatedUserRollout(spec.environment, spec.max_turns)}


class SimulatedUserRollout:
    """GRPOTrainer's ``rollout_func`` for a simulated user: one conversation per prompt (the
    trainer already repeats each prompt ``num_generations`` times), generated turn by turn."""

    def __init__(self, user: Callable[[list[dict[str, Any]]], str | None], max_turns: int) -> None:
        self.user = user
        self.max_turns = max_turns
        self.turns_total = 0  # assistant turns generated, over the run
        self.user_calls = 0
        self.conversations = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        histories = [as_conversation(p) for p in prompts]
        prompt_ids = [_render(tokenizer, h, generation_prompt=True) for h in histories]
        completion_ids: list[list[int]] = [[] for _ in prompts]
        env_mask: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        eos = _eos_ids(trainer)
        for turn in range(1, self.max_turns + 1):
            inputs = [prompt_ids[i] + completion_ids[i] for i in active]
            generated = _generate(trainer, inputs, eos)
            still = []
            for i, ids in zip(active, generated, strict=True):
                completion_ids[i] += ids
                env_mask[i] += [1] * len(ids)
                self.turns_total += 1
                histories[i].append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
                if turn == self.max_turns:
                    continue
                self.user_calls += 1
                reply = self.user([dict(m) for m in histories[i]])
                if reply is None:
                    continue
                if not ids or ids[-1] not in eos:  # a turn cut at the length limit still ends
                    completion_ids[i].append(eos[0])
                    env_mask[i].append(0)
                suffix = _user_suffix(tokenizer, histories[i], str(reply))
                histories[i].append({"role": "user", "content": str(reply)})
                completion_ids[i] += suffix
                env_mask[i] += [0] * len(suffix)  # the user's words are not the policy's to learn
                still.append(i)
            active = still
            if not active:
                break
        self.conversations += len(prompts)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,  # generated by the model being trained: no importance-sampling correction
            "env_mask": env_mask,
            "conversation": histories,
        }


def _render(tokenizer: Any, messages: list[dict[str, Any]], *, generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _user_suffix(tokenizer: Any, history: list[dict[str, Any]], reply: str) -> list[int]:
    """Token ids that follow the assistant's turn: the end of that turn as the template writes
    it, the user's message, and the next assistant header. Taken as the difference of two
    renderings, so the template's own separators are used."""
    before = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=False)
    after = tokenizer.apply_chat_template(
        [*history, {"role": "user", "content": reply}], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(before):
        raise ValueError("multi_turn: the chat template does not preserve the conversation's prefix across turns")
    tail = after[len(before) :]
    # The generated turn already ended with the end-of-turn token; the template writes it too.
    end = tokenizer.eos_token or ""
    if end and before.rstrip().endswith(end):
        tail = before[before.rstrip().rfind(end) + len(end) :] + tail
    return list(tokenizer(tail, add_special_tokens=False)["input_ids"])


def _eos_ids(trainer: Any) -> list[int]:
    ids = getattr(trainer, "eos_token_ids", None) or [trainer.processing_class.eos_token_id]
    return [int(i) for i in (ids if isinstance(ids, list | tuple) else [ids])]


def _generate(trainer: Any, inputs: list[list[int]], eos: list[int]) -> list[list[int]]:
    """One sampled turn per input with the trainer's model and generation settings, each cut
    after its first end-of-turn token (as TRL's own generation path does)."""
    import torch
    from trl.models import unwrap_model_for_generation

    pad_id = trainer.processing_class.pad_token_id
    width = max(len(ids) for ids in inputs)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in inputs])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in inputs])
    device = trainer.accelerator.device
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
    ):
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=mask.to(device), generation_config=trainer.generation_config
        )
    turns = []
    for row in out[:, width:].tolist():
        cut = next((k for k, tok in enumerate(row) if tok in eos), None)
        turns.append(row[: cut + 1] if cut is not None else row)
    return turns
