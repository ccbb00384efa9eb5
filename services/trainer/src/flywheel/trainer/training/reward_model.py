"""Reward model: a one-output scorer trained on chosen/rejected pairs (Bradley-Terry), scored
at the last non-pad token. Optional columns: prompt, margin.

Scored rows work too: ``prompt`` + ``completion`` (or ``response``, the trace store's reward
export) + ``score``. Within each prompt the responses become pairs, the higher score chosen
and ``margin`` the score difference, so the model learns by how much one answer beats another
(no MSE regression on the raw scores, which drift between judges)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from flywheel.trainer.training.common import Context, require_columns

REWARD_MODEL = True
# Pairs kept per prompt (those with the largest margins): n responses make n(n-1)/2 pairs.
MAX_PAIRS_PER_PROMPT = 32


def check_columns(columns: set[str]) -> None:
    require_columns(
        columns,
        "reward_model",
        {"chosen", "rejected"},
        {"prompt", "completion", "score"},
        {"prompt", "response", "score"},
    )


def _prompt_key(prompt: Any) -> str:
    # As the trace store groups them: prompts differing only in whitespace or case are one prompt.
    text = prompt if isinstance(prompt, str) else repr(prompt)
    return re.sub(r"\s+", " ", text).strip().lower()


def pairs_from_scores(
    rows: list[dict[str, Any]], *, max_pairs_per_prompt: int = MAX_PAIRS_PER_PROMPT
) -> list[dict[str, Any]]:
    """Scored rows (``prompt``, ``completion`` or ``response``, ``score``) as preference pairs
    within each prompt: ``{"prompt", "chosen", "rejected", "margin"}`` with the higher score
    chosen and ``margin`` = the score difference; responses with equal scores make no pair."""
    text_column = "completion" if "completion" in rows[0] else "response"
    groups: dict[str, list[tuple[float, str, Any]]] = defaultdict(list)
    for i, row in enumerate(rows):
        try:
            score = float(row["score"])
        except (TypeError, ValueError):
            raise ValueError(f"dataset: row {i}: score {row['score']!r} is not a number") from None
        if not math.isfinite(score):
            raise ValueError(f"dataset: row {i}: score {score} is not finite")
        groups[_prompt_key(row["prompt"])].append((score, str(row[text_column]), row["prompt"]))
    pairs: list[dict[str, Any]] = []
    for items in groups.values():
        ranked = sorted(items, key=lambda item: (-item[0], item[1]))
        candidates = [
            (better[0] - worse[0], better, worse)
            for i, better in enumerate(ranked)
            for worse in ranked[i + 1 :]
            if better[0] > worse[0] and better[1] != worse[1]
        ]
        candidates.sort(key=lambda c: -c[0])
        for margin, better, worse in candidates[:max_pairs_per_prompt]:
            pairs.append({"prompt": better[2], "chosen": better[1], "rejected": worse[1], "margin": margin})
    if not pairs:
        raise ValueError("dataset: no pairs: within every prompt the responses have the same score (or there is one)")
    return pairs


def build(ctx: Context) -> Any:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    if "score" in ctx.dataset.column_names and "chosen" not in ctx.dataset.column_names:
        ctx.dataset = Dataset.from_list(pairs_from_scores(ctx.dataset.to_list()))
    return ctx.trainer(RewardTrainer, RewardConfig(**ctx.args(max_length=ctx.spec.max_length)))
