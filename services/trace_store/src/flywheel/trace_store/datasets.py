"""Training datasets from traces: preference pairs, SFT rows and reward-model rows.

Each trace gives one example: its task (the input of its root or first prompt span), its response (the
last content span's output, else the last prompt's output) and its reward (the mean of
its normalised reward spans, else its decision's feedback). Examples are deduplicated
on (prompt, response) with their rewards averaged and every source trace id kept as
provenance, then split into train and validation *by prompt*, so no prompt is in both.

Rows use TRL's column names: ``prompt``/``chosen``/``rejected`` for DPO,
``prompt``/``completion`` for SFT, and ``prompt``/``response``/``score`` for a
pointwise reward model.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("preference", "sft", "reward")


@dataclass(frozen=True)
class Example:
    trace_id: str
    prompt: str
    response: str
    reward: float


@dataclass(frozen=True)
class _Unique:
    prompt: str
    response: str
    reward: float
    trace_ids: tuple[str, ...]


def prompt_key(prompt: str) -> str:
    """Prompts that differ only in whitespace or case are the same prompt."""
    return re.sub(r"\s+", " ", prompt).strip().lower()


def _dedup(examples: Iterable[Example]) -> dict[str, list[_Unique]]:
    groups: dict[tuple[str, str], list[Example]] = defaultdict(list)
    for e in examples:
        if e.prompt.strip() and e.response.strip() and math.isfinite(e.reward):
            groups[(prompt_key(e.prompt), e.response.strip())].append(e)
    by_prompt: dict[str, list[_Unique]] = defaultdict(list)
    for (key, response), group in sorted(groups.items()):
        by_prompt[key].append(
            _Unique(
                prompt=group[0].prompt,
                response=response,
                reward=sum(e.reward for e in group) / len(group),
                trace_ids=tuple(sorted(e.trace_id for e in group)),
            )
        )
    return by_prompt


def build_rows(
    kind: str, examples: Iterable[Example], *, min_reward: float = 0.8, min_margin: float = 0.0
) -> dict[str, list[dict[str, object]]]:
    """Rows of a dataset kind, grouped by prompt key."""
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}")
    rows: dict[str, list[dict[str, object]]] = {}
    for key, items in _dedup(examples).items():
        out: list[dict[str, object]] = []
        if kind == "preference":
            ranked = sorted(items, key=lambda u: (-u.reward, u.response))
            # Best with worst, second best with second worst...: each response in one pair at most.
            for i in range(len(ranked) // 2):
                chosen, rejected = ranked[i], ranked[-1 - i]
                if chosen.reward - rejected.reward > min_margin:
                    out.append(
                        {
                            "prompt": chosen.prompt,
                            "chosen": chosen.response,
                            "rejected": rejected.response,
                            "chosen_score": chosen.reward,
                            "rejected_score": rejected.reward,
                            "trace_ids": sorted(chosen.trace_ids + rejected.trace_ids),
                        }
                    )
        elif kind == "sft":
            out = [
                {"prompt": u.prompt, "completion": u.response, "score": u.reward, "trace_ids": list(u.trace_ids)}
                for u in items
                if u.reward >= min_reward
            ]
        else:
            out = [
                {"prompt": u.prompt, "response": u.response, "score": u.reward, "trace_ids": list(u.trace_ids)}
                for u in items
            ]
        if out:
            rows[key] = out
    return rows


def split_by_prompt(
    rows: dict[str, list[dict[str, object]]], validation_fraction: float
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Train and validation rows; a prompt's rows all land in one split. Prompts are ordered
    by a hash of their key (deterministic, unrelated to their content's order) and the first
    ``ceil(fraction * prompts)`` go to validation, keeping at least one prompt for training."""
    if not 0 <= validation_fraction < 1:
        raise ValueError("validation_fraction must be in [0, 1)")
    keys = sorted(rows, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    n_val = min(math.ceil(validation_fraction * len(keys)), max(len(keys) - 1, 0))
    validation = [r for k in keys[:n_val] for r in rows[k]]
    train = [r for k in keys[n_val:] for r in rows[k]]
    return train, validation
