"""Held-out evaluation of a trained adapter, run after a training job; the figures are stored
with the version.

- Reward model: pairwise accuracy, the share of held-out pairs whose chosen answer outscores
  the rejected one, with a Wilson 95% interval and the mean score margin.
- Policy: the win rate of the adapter's greedy answer over its base's (the same weights with
  the adapter switched off), judged by ``judge_rank`` in both orders to cancel position bias,
  plus any verifiable metric the job names (adapter mean, base mean, delta).

Models are loaded as training loads them (``load_for_training``) with the adapter on top, in
eval mode and without gradients; one load serves both the base and the adapter outputs."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.trainer.training.models import load_for_training

Z95 = 1.959963984540054  # the two-sided 95% normal quantile
JUDGE_CONCURRENCY = 8  # prompts judged at once (each is two judge calls)

JudgeRank = Callable[[str, list[str]], Awaitable[list[float] | None]]
Metric = Callable[..., Any]  # f(prompts=, completions=, **columns) -> list[float | None], maybe awaitable


@dataclass
class Evaluation:
    """What an evaluation measured: flat figures for the version, how many samples it used, and
    one record per sample for reports."""

    metrics: dict[str, float]
    samples: int
    details: list[dict[str, Any]] = field(default_factory=list)


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be fractional: a tie is half a
    win). Stays inside [0, 1] and is sensible for small n and proportions near 0 or 1."""
    if n <= 0:
        raise ValueError("wilson_interval: n must be positive")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


# --- loading -----------------------------------------------------------------------------


def _check_adapter(adapter_dir: str | Path, task_type: str) -> Path:
    path = Path(adapter_dir)
    config = path / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"adapter_dir {str(adapter_dir)!r}: no adapter_config.json (not a LoRA adapter)")
    found = json.loads(config.read_text()).get("task_type")
    if found != task_type:
        raise ValueError(f"adapter_dir {str(adapter_dir)!r}: a {found} adapter, this evaluation needs {task_type}")
    return path


def _load(base_model: str, adapter_dir: str | Path | None, *, reward_model: bool, device: str) -> tuple[Any, Any]:
    """The base (as training loads it) with the adapter on top when given, in eval mode."""
    from peft import PeftModel

    path = _check_adapter(adapter_dir, "SEQ_CLS" if reward_model else "CAUSAL_LM") if adapter_dir is not None else None
    loaded = load_for_training(base_model, reward_model=reward_model, device=device)
    model = loaded.model
    if path is not None:
        model = PeftModel.from_pretrained(model, str(path), is_trainable=False)
    model.eval()
    return model, loaded.tokenizer


def _check_count(rows: list[dict[str, Any]], max_samples: int, required: tuple[str, ...]) -> list[dict[str, Any]]:
    if max_samples <= 0:
        raise ValueError(f"max_samples must be positive, got {max_samples}")
    if not rows:
        raise ValueError("rows: nothing to evaluate")
    rows = list(rows[:max_samples])
    for i, row in enumerate(rows):
        missing = [c for c in required if c not in row]
        if missing:
            raise ValueError(f"rows: row {i} has no {', '.join(repr(c) for c in missing)} column")
    return rows


# --- reward model ------------------------------------------------------------------------


def _pair_ids(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids of (chosen, rejected) exactly as TRL's RewardTrainer builds them: the prompt
    prepended; a chat template for conversations, else plain text ending with EOS."""
    chosen, rejected = row["chosen"], row["rejected"]
    if row.get("prompt") is not None:
        chosen, rejected = row["prompt"] + chosen, row["prompt"] + rejected
    if isinstance(chosen, list):
        return tuple(  # type: ignore[return-value]
            list(tokenizer.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"])
            for m in (chosen, rejected)
        )
    eos = tokenizer.eos_token or ""
    texts = [t if t.endswith(eos) else t + eos for t in (str(chosen), str(rejected))]
    return tuple(list(tokenizer(text=t)["input_ids"]) for t in texts)  # type: ignore[return-value]


def _scores(model: Any, tokenizer: Any, sequences: list[list[int]], batch_size: int) -> list[float]:
    """The reward model's score of each token sequence (right padded, as in training)."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    scores: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(sequences), batch_size):
            batch = sequences[start : start + batch_size]
            width = max(len(s) for s in batch)
            ids = torch.tensor([s + [pad] * (width - len(s)) for s in batch], device=device)
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch], device=device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            scores.extend(float(v) for v in logits.float().squeeze(-1).tolist())
    return scores


def evaluate_reward_model(
    adapter_dir: str | Path,
    base_model: str,
    rows: list[dict[str, Any]],
    *,
    device: str = "auto",
    max_samples: int = 64,
    batch_size: int = 8,
) -> Evaluation:
    """Pairwise accuracy of a reward-model adapter on held-out ``rows`` (``chosen``,
    ``rejected``, optional ``prompt``; or scored rows, ``prompt`` + ``completion``/``response``
    + ``score``, paired as training pairs them; the first ``max_samples`` pairs): a pair counts as right when
    score(chosen) > score(rejected), a tie as wrong. Metrics: pairwise_accuracy,
    pairwise_accuracy_ci_low/high (Wilson 95%), mean_margin (score(chosen) - score(rejected)), n."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if rows and "score" in rows[0] and "chosen" not in rows[0]:
        # Scored rows (the trace store's reward export): the pairs the reward model trains on.
        from flywheel.trainer.training.reward_model import pairs_from_scores

        rows = pairs_from_scores(rows)
    rows = _check_count(rows, max_samples, ("chosen", "rejected"))
    model, tokenizer = _load(base_model, adapter_dir, reward_model=True, device=device)
    pairs = [_pair_ids(tokenizer, row) for row in rows]
    # Chosen and rejected of a pair go through separate batches' padding only; scores do not
    # depend on the padding (attention mask and last non-pad pooling).
    scores = _scores(model, tokenizer, [s for pair in pairs for s in pair], batch_size)
    chosen, rejected = scores[0::2], scores[1::2]
    right = sum(c > r for c, r in zip(chosen, rejected, strict=True))
    n = len(rows)
    low, high = wilson_interval(right, n)
    details = [
        {
            "prompt": row.get("prompt"),
            "chosen": row["chosen"],
            "rejected": row["rejected"],
            "score_chosen": c,
            "score_rejected": r,
            "correct": c > r,
        }
        for row, c, r in zip(rows, chosen, rejected, strict=True)
    ]
    metrics = {
        "pairwise_accuracy": right / n,
        "pairwise_accuracy_ci_low": low,
        "pairwise_accuracy_ci_high": high,
        "mean_margin": sum(c - r for c, r in zip(chosen, rejected, strict=True)) / n,
        "n": float(n),
    }
    return Evaluation(metrics=metrics, samples=n, details=details)


# --- generation --------------------------------------------------------------------------


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def _prompt_text(tokenizer: Any, prompt: Any) -> tuple[str, bool]:
    """The text to continue, and whether the tokenizer should add its special tokens (a chat
    template already wrote them)."""
    if isinstance(prompt, str):
        return prompt, True
    if not _is_chat(prompt):
        raise ValueError(f"prompt: expected a string or a list of chat messages, got {type(prompt).__name__}")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), False
    # No template: a plain transcript ending where the assistant speaks.
    lines = [f"{m['role']}: {m.get('content', '')}" for m in prompt]
    return "\n".join([*lines, "assistant:"]), True


def _generate_with(model: Any, tokenizer: Any, prompts: list[Any], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy continuations of ``prompts`` (left padded so every row ends where it generates)."""
    import torch

    device = next(model.parameters()).device
    outputs: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            rendered = [_prompt_text(tokenizer, p) for p in prompts[start : start + batch_size]]
            special = all(add for _, add in rendered)
            inputs = tokenizer(
                [text for text, _ in rendered],
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=special,
            ).to(device)
            generated = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = generated[:, inputs["input_ids"].shape[1] :]
            outputs.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    return outputs


def generate(
    base_model: str,
    prompts: list[Any],
    *,
    adapter_dir: str | Path | None = None,
    max_new_tokens: int = 64,
    device: str = "auto",
    batch_size: int = 8,
) -> list[str]:
    """Greedy answers of ``base_model`` (with the LoRA adapter in ``adapter_dir`` when given) to
    ``prompts``: strings, or chat message lists rendered with the tokenizer's chat template."""
    if max_new_tokens <= 0 or batch_size <= 0:
        raise ValueError(f"max_new_tokens and batch_size must be positive, got {max_new_tokens}, {batch_size}")
    if not prompts:
        return []
    model, tokenizer = _load(base_model, adapter_dir, reward_model=False, device=device)
    return _generate_with(model, tokenizer, list(prompts), max_new_tokens, batch_size)


def _generate_both(
    base_model: str, adapter_dir: str | Path, prompts: list[Any], max_new_tokens: int, device: str, batch_size: int
) -> tuple[list[str], list[str]]:
    """(adapter outputs, base outputs) from one load: the base is the adapter switched off."""
    model, tokenizer = _load(base_model, adapter_dir, reward_model=False, device=device)
    adapter = _generate_with(model, tokenizer, prompts, max_new_tokens, batch_size)
    with model.disable_adapter():
        base = _generate_with(model, tokenizer, prompts, max_new_tokens, batch_size)
    return adapter, base


# --- policy ------------------------------------------------------------------------------


def judge_prompt(prompt: Any) -> str:
    """A prompt as the judge reads it: the text itself, a lone message's content, or a
    conversation as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    if _is_chat(prompt):
        if len(prompt) == 1:
            return str(prompt[0].get("content", ""))
        return "\n".join(f"{m['role']}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


def _outcome(mine: float, other: float) -> float:
    return 1.0 if mine > other else 0.5 if mine == other else 0.0


def _two_scores(scores: Any, order: str) -> tuple[float, float] | None:
    if scores is None:
        return None
    values = [float(s) for s in scores]
    if len(values) != 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"judge_rank ({order}): expected two finite scores, got {scores!r}")
    return values[0], values[1]


async def _judge_pair(judge_rank: JudgeRank, prompt: str, adapter: str, base: str) -> dict[str, Any]:
    """Both orders: the adapter's win (1, 0.5 or 0) averaged over them; None if either is missing
    (one order alone would not cancel position bias)."""
    first, second = await asyncio.gather(judge_rank(prompt, [adapter, base]), judge_rank(prompt, [base, adapter]))
    a_first = _two_scores(first, "adapter first")
    b_first = _two_scores(second, "base first")
    record: dict[str, Any] = {"adapter_first": a_first, "base_first": b_first, "win": None}
    if a_first is not None and b_first is not None:
        record["win"] = (_outcome(a_first[0], a_first[1]) + _outcome(b_first[1], b_first[0])) / 2
    return record


async def _judge_all(judge_rank: JudgeRank, prompts: list[str], adapter: list[str], base: list[str]) -> list[dict]:
    gate = asyncio.Semaphore(JUDGE_CONCURRENCY)

    async def one(prompt: str, a: str, b: str) -> dict[str, Any]:
        if a == b:  # nothing to judge: a tie
            return {"adapter_first": None, "base_first": None, "win": 0.5, "identical": True}
        async with gate:
            return {**await _judge_pair(judge_rank, prompt, a, b), "identical": False}

    return list(await asyncio.gather(*(one(p, a, b) for p, a, b in zip(prompts, adapter, base, strict=True))))


async def _metric_values(
    name: str, fn: Metric, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
) -> list[float | None]:
    result = fn(prompts=prompts, completions=completions, **columns)
    if inspect.isawaitable(result):
        result = await result
    values = list(result)
    if len(values) != len(completions):
        raise ValueError(f"metric {name!r} returned {len(values)} values for {len(completions)} completions")
    out: list[float | None] = []
    for v in values:
        if v is not None and not math.isfinite(float(v)):
            raise ValueError(f"metric {name!r} returned {v} (not finite)")
        out.append(None if v is None else float(v))
    return out


def _mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _unique_names(metrics: Sequence[tuple[str, Metric]]) -> list[tuple[str, Metric]]:
    """Two metrics with one name (say exact match on two columns) keep both figures: the later
    ones get ``_2``, ``_3``... rather than overwrite the first or fail a finished job."""
    seen: set[str] = set()
    out = []
    for name, fn in metrics:
        if not name:
            raise ValueError("metrics: a metric has an empty name")
        unique, k = name, 1
        while unique in seen:
            k += 1
            unique = f"{name}_{k}"
        seen.add(unique)
        out.append((unique, fn))
    return out


async def evaluate_policy(
    adapter_dir: str | Path,
    base_model: str,
    rows: list[dict[str, Any]],
    *,
    judge_rank: JudgeRank | None,
    metrics: Sequence[tuple[str, Metric]] = (),
    max_samples: int = 64,
    max_new_tokens: int = 64,
    device: str = "auto",
) -> Evaluation:
    """A policy adapter against its base on held-out ``rows`` (``prompt`` plus the columns the
    metrics read; the first ``max_samples``), both answering greedily.

    Win rate: ``judge_rank(prompt, [x, y])`` scores two answers; it is asked with the adapter
    first and with the base first, and the adapter's outcome (win 1, tie 0.5, loss 0) averaged.
    Identical answers are a tie without a call. When the judge returns None for a prompt, the
    prompt is left out of the win rate and counted in ``judge_missing``. Metrics: win_rate,
    win_rate_ci_low/high (Wilson 95%), judged, judge_missing, identical (none of these when
    ``judge_rank`` is None, nor the win rate when nothing was judged); for each
    ``(name, f)`` in ``metrics``, called like a TRL reward ``f(prompts=, completions=,
    **columns)``: ``name`` (adapter mean), ``name_base``, ``name_delta`` (left out when it
    scored nothing; a repeated name gets ``_2``...); n."""
    rows = _check_count(rows, max_samples, ("prompt",))
    prompts = [row["prompt"] for row in rows]
    named = _unique_names(metrics)
    # Generation is long and synchronous: off the event loop, so a server stays responsive.
    adapter_out, base_out = await asyncio.to_thread(
        _generate_both, base_model, adapter_dir, prompts, max_new_tokens, device, 8
    )
    n = len(rows)
    details: list[dict[str, Any]] = [
        {"prompt": p, "adapter": a, "base": b} for p, a, b in zip(prompts, adapter_out, base_out, strict=True)
    ]
    figures: dict[str, float] = {"n": float(n)}

    if judge_rank is not None:
        judged = await _judge_all(judge_rank, [judge_prompt(p) for p in prompts], adapter_out, base_out)
        wins = [j["win"] for j in judged if j["win"] is not None]
        for record, verdict in zip(details, judged, strict=True):
            record.update(verdict)
        figures["judged"] = float(len(wins))
        figures["judge_missing"] = float(n - len(wins))
        figures["identical"] = float(sum(j["identical"] for j in judged))
        if wins:
            low, high = wilson_interval(sum(wins), len(wins))
            figures.update(win_rate=sum(wins) / len(wins), win_rate_ci_low=low, win_rate_ci_high=high)

    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}
    chat = any(_is_chat(p) for p in prompts)

    def as_completions(texts: list[str]) -> list[Any]:
        # TRL's convention: conversational prompts get message-list completions.
        return [[{"role": "assistant", "content": t}] for t in texts] if chat else texts

    for name, fn in named:
        mine = await _metric_values(name, fn, prompts, as_completions(adapter_out), columns)
        theirs = await _metric_values(name, fn, prompts, as_completions(base_out), columns)
        for record, m, t in zip(details, mine, theirs, strict=True):
            record[name], record[f"{name}_base"] = m, t
        mean_mine, mean_theirs = _mean(mine), _mean(theirs)
        if mean_mine is not None and mean_theirs is not None:
            figures.update({name: mean_mine, f"{name}_base": mean_theirs, f"{name}_delta": mean_mine - mean_theirs})
    return Evaluation(metrics=figures, samples=n, details=details)


__all__ = [
    "Evaluation",
    "evaluate_policy",
    "evaluate_reward_model",
    "generate",
    "judge_prompt",
    "wilson_interval",
]
