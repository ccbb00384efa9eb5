"""Multi-turn GRPO on the CPU: a simulated user drives two-turn conversations through TRL's
``rollout_func``; an environment with tools goes to TRL's ``environment_factory``, which needs
a chat template that renders tool calls (tiny's SmolLM2 template cannot: refused, saying so)."""

from __future__ import annotations

import json
import math
import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches
from pydantic import ValidationError  # noqa: E402 - after the offline switches

from flywheel.trainer.training import (  # noqa: E402 - after the offline switches
    RewardFunction,
    TrainSpec,
    models,
    multiturn,
    train,
)
from flywheel.trainer.training.multiturn import (  # noqa: E402 - after the offline switches
    ENVIRONMENT,
    SIMULATED_USER,
    SimulatedUserRollout,
    driver_kind,
)
from flywheel.trainer.training.spec import MultiTurnSpec  # noqa: E402 - after the offline switches

ROWS = [{"prompt": f"Capital of {c}? One word.", "answer": a} for c, a in (("France", "Paris"), ("Japan", "Tokyo"))]


class FollowUpUser:
    """Asks one follow-up question, then ends the conversation."""

    def __init__(self) -> None:
        self.histories: list[list[dict]] = []

    def __call__(self, history: list[dict]) -> str | None:
        self.histories.append(history)
        assistant_turns = sum(m["role"] == "assistant" for m in history)
        return "And its population?" if assistant_turns == 1 else None


class Calculator:
    """An environment: its public methods are the model's tools."""

    resets: list[dict] = []

    def reset(self, **row: object) -> str | None:
        Calculator.resets.append(row)
        return "Use the add tool if you need it."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The sum.
        """
        return a + b


def spec(multi_turn: MultiTurnSpec, rewards: list[RewardFunction], **overrides: object) -> TrainSpec:
    fields: dict = {
        "kind": "grpo",
        "base_model": "tiny",
        "max_steps": 1,
        "batch_size": 2,
        "max_length": 128,
        "num_generations": 2,
        "max_completion_length": 5,
        "beta": 0.04,
        "lora": {"r": 4, "alpha": 8},
        "rewards": rewards,
        "multi_turn": multi_turn,
    }
    fields.update(overrides)
    return TrainSpec(**fields)


def test_a_simulated_user_drives_two_turn_conversations(tmp_path) -> None:
    user = FollowUpUser()
    seen: list[dict] = []

    def turns(prompts: list, completions: list, conversation: list, **columns: object) -> list[float]:
        seen.extend(
            {"prompt": p, "completion": c, "conversation": h}
            for p, c, h in zip(prompts, completions, conversation, strict=True)
        )
        return [float(len(str(c))) / 100 for c in completions]

    result = train(spec(MultiTurnSpec(environment=user, max_turns=2), [RewardFunction(fn=turns)]), ROWS, tmp_path)

    assert result.global_step == 1 and result.loss and math.isfinite(result.loss[-1]["value"])
    assert len(user.histories) == 2 * 2  # asked once per conversation: 2 prompts x 2 generations
    assert all(h[-1]["role"] == "assistant" and h[-2]["role"] == "user" for h in user.histories)
    assert len(seen) == 4
    for one in seen:
        roles = [m["role"] for m in one["conversation"]]
        assert roles[-4:] == ["user", "assistant", "user", "assistant"]  # two assistant turns
        assert one["conversation"][-2]["content"] == "And its population?"
        # The completion the reward sees is the whole conversation after the prompt, user turn included.
        assert "And its population?" in one["completion"][-1]["content"]
    saved = json.loads((tmp_path / "training_results.json").read_text())
    assert saved["multi_turn"]["max_turns"] == 2 and saved["multi_turn"]["environment"].endswith("FollowUpUser")


def test_one_turn_when_the_user_ends_at_once(tmp_path) -> None:
    calls = []

    def silent(history: list[dict]) -> None:
        calls.append(len(history))

    seen: list[list] = []

    def record(prompts: list, completions: list, conversation: list, **columns: object) -> list[float]:
        seen.extend(conversation)
        return [float(i) for i in range(len(completions))]

    train(spec(MultiTurnSpec(environment=silent, max_turns=3), [RewardFunction(fn=record)]), ROWS, tmp_path)
    assert len(calls) == 4 and all(sum(m["role"] == "assistant" for m in h) == 1 for h in seen)


def test_an_environment_needs_a_tool_calling_chat_template(tmp_path) -> None:
    assert driver_kind(Calculator) == ENVIRONMENT
    assert driver_kind(lambda: Calculator()) == ENVIRONMENT
    assert driver_kind(FollowUpUser()) == SIMULATED_USER
    run = spec(MultiTurnSpec(environment=Calculator, max_turns=2), [RewardFunction(fn=lambda **kw: [0.0] * 4)])
    with pytest.raises(ValueError, match="chat template that can render a tool-calling conversation"):
        train(run, ROWS, tmp_path)
    with pytest.raises(ValidationError, match="multi_turn: only grpo"):
        spec(MultiTurnSpec(environment=Calculator), [RewardFunction(fn=lambda **kw: [])], kind="rloo")
    with pytest.raises(ValidationError, match="not callable"):
        MultiTurnSpec(environment="tests:nothing")


def test_a_jobs_environment_path_is_resolved_under_the_run_policy() -> None:
    from flywheel.core.run_policy import RunPolicySettings

    allowed = RunPolicySettings(callable_modules=[__name__])
    resolved = multiturn.from_path(f"{__name__}:Calculator", 0, policy=allowed)
    assert resolved.environment is Calculator and resolved.max_turns == 2
    with pytest.raises(ValueError, match=f"multi_turn.environment: '{__name__}:Calculator': module .* is not one"):
        multiturn.from_path(f"{__name__}:Calculator", 3, policy=RunPolicySettings())
    with pytest.raises(ValueError, match="'os:system'"):
        multiturn.from_path("os:system", 3, policy=allowed)


def test_the_rollout_masks_the_users_words_out_of_the_loss(monkeypatch) -> None:
    """The token layout of a two-turn conversation, with the model's turns scripted: the user's
    message and the template's separators are in the completion with env_mask 0."""
    tokenizer = models.tiny_tokenizer()
    scripted = iter(
        [[tokenizer("Paris<|im_end|>", add_special_tokens=False)["input_ids"]], [[tokenizer("Nine")["input_ids"][0]]]]
    )
    monkeypatch.setattr(multiturn, "_generate", lambda trainer, inputs, eos: next(scripted))

    class Trainer:
        processing_class = tokenizer
        eos_token_ids = [tokenizer.eos_token_id]

    user = FollowUpUser()
    out = SimulatedUserRollout(user, max_turns=2)(["Capital of France?"], Trainer())

    (completion,), (mask,) = out["completion_ids"], out["env_mask"]
    assert len(completion) == len(mask)
    policy = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if m])
    others = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if not m])
    assert policy.startswith("Paris<|im_end|>") and "population" not in policy
    assert others == "\n<|im_start|>user\nAnd its population?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(out["prompt_ids"][0]).endswith("Capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert out["logprobs"] is None and [m["role"] for m in out["conversation"][0]][-3:] == [
        "assistant",
        "user",
        "assistant",
    ]


def test_an_environment_runs_through_trls_environment_factory(tmp_path, monkeypatch) -> None:
    """With a chat template that renders tools (Qwen2.5's, on tiny's vocabulary), the environment
    goes to TRL's environment_factory on the CPU: one instance reset per rollout, its observation
    appended to the prompt. (A random model calls no tool; TRL's tool loop is TRL's.)"""
    from trl.chat_template_utils import qwen2_5_chat_template

    plain = models.tiny_tokenizer

    def with_tools():
        tokenizer = plain()
        tokenizer.chat_template = qwen2_5_chat_template
        return tokenizer

    monkeypatch.setattr(models, "tiny_tokenizer", with_tools)
    Calculator.resets.clear()
    seen_prompts: list = []

    def record(prompts: list, completions: list, **columns: object) -> list[float]:
        seen_prompts.extend(prompts)
        return [float(i) for i in range(len(completions))]

    result = train(
        spec(MultiTurnSpec(environment=Calculator, max_turns=2), [RewardFunction(fn=record)]), ROWS, tmp_path
    )
    assert result.global_step == 1
    assert len(Calculator.resets) == 2 * 2 and {r["answer"] for r in Calculator.resets} == {"Paris", "Tokyo"}
    assert len(seen_prompts) == 4
    assert all(p[-1]["content"].endswith("Use the add tool if you need it.") for p in seen_prompts)
