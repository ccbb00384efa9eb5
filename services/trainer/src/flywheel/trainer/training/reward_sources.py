"""The reward sources of a GRPO/RLOO job as TRL reward functions: a trained reward-model
version, the reward judge over gRPC, a verifiable check (exact match on a column, or an
allowed Python callable), or RLP's information gain about an outcome column. One
:class:`RewardSourceSpec` per ``RewardSource`` of the job; the job runner downloads a
reward-model version before building.

- **Reward model**: the base model as a one-output sequence classifier with the version's LoRA
  ``SEQ_CLS`` adapter (its score head included) on top, scoring prompt + completion at the last
  non-pad token, batched, without gradients. The reward is the **raw logit**: unbounded, only
  differences within a group matter to GRPO/RLOO (the advantage is normalised per group), so
  weigh it against bounded rewards with that in mind.
- **Judge**: an async reward; ``Score`` for every completion concurrently (bounded by a
  semaphore), or with ``rank`` one ``Rank`` call per group of ``num_generations`` completions
  (relative scores, the judge seeing the group together). A completion the judge cannot score
  (down, timed out, refused) gets None, which TRL treats as missing; failures are counted and
  logged, and never end the run.
- **Verifiable**: :func:`flywheel.core.text_metrics.exact_match` of the completion against a
  dataset column, or ``module:function`` resolved under the run policy
  (:func:`flywheel.core.callables.resolve_callable`, the evaluator's checks), called as
  ``f(prompts=, completions=, **columns) -> list[float | None]``.
- **Information gain** (RLP, arXiv 2510.01265): ``log p(x | c, z) - log p(x | c)`` of the
  outcome column ``x`` given the prompt ``c`` with and without the completion (the thought)
  ``z``, both under the adapter-free base (the policy with its LoRA switched off); see
  :mod:`flywheel.trainer.training.information_gain_reward`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flywheel.core.callables import resolve_callable
from flywheel.core.judge_client import JudgeClient, JudgeUnavailable
from flywheel.core.run_policy import RunPolicySettings
from flywheel.trainer.training.information_gain_reward import DEFAULT_OUTCOME_COLUMN, InformationGainReward
from flywheel.trainer.training.rewards import completion_text, exact_match
from flywheel.trainer.training.spec import RewardFunction

log = logging.getLogger(__name__)

RESULTS_FILE = "training_results.json"


SOURCE_FIELDS = ("reward_model_dir", "judge_rubric", "exact_match_column", "callable", "information_gain_column")


class RewardSourceSpec(BaseModel):
    """One weighted reward source; exactly one of ``reward_model_dir``, ``judge_rubric``,
    ``exact_match_column``, ``callable`` and ``information_gain_column`` is set
    (``judge_rubric=""`` is the judge's default rubric)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, allow_inf_nan=False)
    # A reward-model version's folder: the output of train(kind="reward_model") (with adapter/
    # and training_results.json) or its adapter/ folder alone.
    reward_model_dir: str | None = None
    # The reward model's base; None: the base_model in its training_results.json.
    reward_model_base: str | None = None
    judge_rubric: str | None = None
    judge_rank: bool = False
    exact_match_column: str | None = Field(None, min_length=1)
    callable: str | None = Field(None, min_length=1)
    # RLP's information gain about this column's outcome text (the proto's default: "outcome").
    information_gain_column: str | None = Field(None, min_length=1)
    name: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> RewardSourceSpec:
        chosen = [f for f in SOURCE_FIELDS if getattr(self, f) is not None]
        if len(chosen) != 1:
            raise ValueError(
                f"reward source: set exactly one of {', '.join(SOURCE_FIELDS)} (got {', '.join(chosen) or 'none'})"
            )
        if self.judge_rank and self.judge_rubric is None:
            raise ValueError("reward source: judge_rank applies to a judge source (judge_rubric) only")
        if self.reward_model_base is not None and self.reward_model_dir is None:
            raise ValueError("reward source: reward_model_base applies to a reward_model_dir source only")
        return self


def from_proto(source: Any, *, reward_model_dir: str | None = None) -> RewardSourceSpec:
    """A job's ``flywheel.api.trainer.v1.RewardSource`` as a spec. A ``reward_policy_id`` names
    a registered reward-model version: the job runner downloads it and passes its folder as
    ``reward_model_dir``."""
    which = source.WhichOneof("source")
    weight = source.weight
    if which == "reward_policy_id":
        if reward_model_dir is None:
            raise ValueError(f"reward_policy_id {source.reward_policy_id!r}: the version's folder was not given")
        return RewardSourceSpec(weight=weight, reward_model_dir=reward_model_dir, name=source.reward_policy_id)
    if which == "judge":
        return RewardSourceSpec(weight=weight, judge_rubric=source.judge.rubric, judge_rank=source.judge.rank)
    if which == "verifiable":
        check = source.verifiable.WhichOneof("check")
        if check == "exact_match_column":
            return RewardSourceSpec(weight=weight, exact_match_column=source.verifiable.exact_match_column)
        if check == "callable":
            return RewardSourceSpec(weight=weight, callable=source.verifiable.callable)
        raise ValueError("reward source: verifiable names neither exact_match_column nor callable")
    if which == "information_gain":
        column = source.information_gain.outcome_column or DEFAULT_OUTCOME_COLUMN
        return RewardSourceSpec(weight=weight, information_gain_column=column)
    raise ValueError("reward source: none of reward_policy_id, judge, verifiable, information_gain is set")


def build_rewards(
    sources: Sequence[RewardSourceSpec],
    *,
    judge: JudgeClient | None,
    policy: RunPolicySettings,
    base_model: str,
    device: str = "auto",
    num_generations: int = 4,
    judge_concurrency: int = 16,
) -> tuple[RewardFunction, ...]:
    """The weighted reward functions of ``sources``, for ``TrainSpec.rewards``. ``base_model``
    is the policy's base, used for a reward model whose results name none. ``num_generations``
    is the group size a ranking judge starts with; ``train()`` sets it to the spec's. Raises ValueError naming the
    source on anything it cannot build (a refused callable, a missing reward-model folder, a
    judge source with no judge client)."""
    built = []
    for i, source in enumerate(sources):
        where = f"rewards[{i}]"
        if source.reward_model_dir is not None:
            fn: Any = RewardModelReward(
                source.reward_model_dir, base_model=source.reward_model_base, fallback_base=base_model, device=device
            )
            default_name = f"reward_model:{Path(source.reward_model_dir).name}"
        elif source.judge_rubric is not None:
            if judge is None:
                raise ValueError(f"{where}: a judge reward needs the reward judge (no judge client configured)")
            fn = JudgeReward(
                judge,
                rubric=source.judge_rubric,
                rank=source.judge_rank,
                num_generations=num_generations,
                concurrency=judge_concurrency,
            )
            default_name = f"judge:{source.judge_rubric or 'default'}{':rank' if source.judge_rank else ''}"
        elif source.exact_match_column is not None:
            fn = exact_match(source.exact_match_column)
            default_name = f"exact_match:{source.exact_match_column}"
        elif source.information_gain_column is not None:
            # Bound to the policy model by train() once the TRL trainer has wrapped it.
            fn = InformationGainReward(source.information_gain_column)
            default_name = f"information_gain:{source.information_gain_column}"
        else:
            assert source.callable is not None
            # CallableRefused is a ValueError that names the path and the policy's reason.
            fn = resolve_callable(source.callable, what=f"{where}.callable", policy=policy)
            default_name = source.callable
        built.append(RewardFunction(fn=fn, weight=source.weight, name=source.name or default_name))
    return tuple(built)


def prompt_text(prompt: Any) -> str:
    """A prompt as text: chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return str(prompt)


# -- reward model ------------------------------------------------------------------------------
def _adapter_and_results(folder: Path) -> tuple[Path, dict[str, Any]]:
    if (folder / "adapter" / "adapter_config.json").is_file():
        adapter = folder / "adapter"
    elif (folder / "adapter_config.json").is_file():
        adapter = folder
    else:
        raise ValueError(
            f"reward_model_dir {str(folder)!r}: no LoRA adapter (adapter_config.json) in it or in adapter/"
        )
    results: dict[str, Any] = {}
    for candidate in (adapter.parent / RESULTS_FILE, adapter / RESULTS_FILE):
        if candidate.is_file():
            results = json.loads(candidate.read_text())
            break
    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("task_type") != "SEQ_CLS" or results.get("kind", "reward_model") != "reward_model":
        raise ValueError(
            f"reward_model_dir {str(folder)!r}: not a reward model (task_type {config.get('task_type')!r},"
            f" kind {results.get('kind')!r})"
        )
    return adapter, results


class RewardModelReward:
    """A reward-model version as a reward: raw score-head logits of prompt + completion."""

    def __init__(
        self,
        folder: str | Path,
        *,
        base_model: str | None = None,
        fallback_base: str | None = None,
        device: str = "auto",
        batch_size: int = 16,
        max_length: int = 1024,
    ) -> None:
        from peft import PeftModel
        from transformers import AutoTokenizer

        from flywheel.trainer.training.models import load_for_training

        adapter, results = _adapter_and_results(Path(folder))
        base = base_model or results.get("base_model") or fallback_base
        if not base:
            raise ValueError(f"reward_model_dir {str(folder)!r}: no base model named (give reward_model_base)")
        loaded = load_for_training(base, reward_model=True, device=device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(adapter))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        loaded.model.config.pad_token_id = self.tokenizer.pad_token_id  # score at the last non-pad token
        self.model = PeftModel.from_pretrained(loaded.model, str(adapter)).eval()
        self.device = loaded.device
        self.base = base
        self.batch_size = batch_size
        self.max_length = max_length
        self.__name__ = f"reward_model_{adapter.parent.name}"

    def sequence_ids(self, prompt: Any, completion: Any) -> list[int]:
        """Token ids of prompt + completion as TRL's RewardTrainer built them in training: a
        conversation through the chat template, else the text with EOS appended; truncated
        keeping the start, as RewardTrainer does."""
        if isinstance(prompt, list):
            reply = completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]
            ids = self.tokenizer.apply_chat_template([*prompt, *reply], tokenize=True, return_dict=True)["input_ids"]
        else:
            eos = self.tokenizer.eos_token or ""
            text = prompt_text(prompt) + completion_text(completion)
            ids = self.tokenizer(text=text if text.endswith(eos) else text + eos)["input_ids"]
        return list(ids)[: self.max_length]

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        import torch

        sequences = [self.sequence_ids(p, c) for p, c in zip(prompts, completions, strict=True)]
        pad = self.tokenizer.pad_token_id
        scores: list[float | None] = []
        with torch.inference_mode():
            for start in range(0, len(sequences), self.batch_size):
                batch = sequences[start : start + self.batch_size]
                width = max(len(ids) for ids in batch)
                # Right padded: the score is read at the last non-pad token.
                input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch], device=self.device)
                mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch], device=self.device)
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits[:, 0]
                scores += [float(x) for x in logits.float().cpu()]
        return scores


# -- judge ---------------------------------------------------------------------------------------
class JudgeReward:
    """The reward judge as an async reward (TRL 1.16 awaits coroutine rewards on its own event
    loop). Counts ``calls`` and ``failures``; a failed completion (or group) scores None."""

    def __init__(
        self, judge: JudgeClient, *, rubric: str, rank: bool, num_generations: int, concurrency: int = 16
    ) -> None:
        self.judge = judge
        self.rubric = rubric
        self.rank = rank
        self.num_generations = num_generations
        self.concurrency = concurrency
        self.calls = 0
        self.failures = 0
        self.last_error = ""
        self.__name__ = "judge_rank" if rank else "judge_score"

    async def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        semaphore = asyncio.Semaphore(self.concurrency)
        texts = [completion_text(c) for c in completions]
        if self.rank:
            n = self.num_generations
            if len(texts) % n:
                raise ValueError(f"judge rank: {len(texts)} completions are not groups of num_generations={n}")
            groups = await asyncio.gather(
                *(
                    self._guarded(semaphore, self._rank, prompts[g], texts[g : g + n], n)
                    for g in range(0, len(texts), n)
                )
            )
            scores: list[float | None] = [s for group in groups for s in group]
        else:
            singles = await asyncio.gather(
                *(self._guarded(semaphore, self._score, p, t, 1) for p, t in zip(prompts, texts, strict=True))
            )
            scores = [s for one in singles for s in one]
        failed = sum(s is None for s in scores)
        if failed:
            log.warning("reward judge: %d of %d completions unscored (%s)", failed, len(scores), self.last_error)
        return scores

    async def _guarded(
        self, semaphore: asyncio.Semaphore, call: Any, prompt: Any, what: Any, n: int
    ) -> list[float | None]:
        async with semaphore:
            self.calls += 1
            try:
                return await call(prompt, what)
            except (JudgeUnavailable, ValueError) as exc:  # down, timed out, refused: missing, not zero
                self.failures += n
                self.last_error = str(exc)
                return [None] * n

    async def _score(self, prompt: Any, text: str) -> list[float | None]:
        got = await self.judge.score(prompt=prompt_text(prompt), response=text, rubric=self.rubric, reference="")
        return [got.score]

    async def _rank(self, prompt: Any, texts: list[str]) -> list[float | None]:
        return list(await self.judge.rank(prompt_text(prompt), texts, self.rubric))
