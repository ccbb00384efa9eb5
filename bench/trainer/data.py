"""Synthetic fixed-length data, the same rows for both sides, and what one step processes.

Texts are runs of words that are each one token with a leading space (" word"), so a prompt
of P words is P tokens and prompt + completion is P + C tokens however they are joined;
``rows`` checks that with the tokenizer. TRL appends the EOS token to DPO's and the reward
model's chosen/rejected texts (one more token each); GRPO generates its completions
(``max_completion_length`` tokens: a random model almost never samples EOS early)."""

from __future__ import annotations

import random
import re
import zlib
from typing import Any

WORD = re.compile(r"[a-z]{3,8}")


def word_pool(tokenizer: Any, size: int = 2000) -> list[str]:
    """Words that the tokenizer encodes, with a leading space, as exactly one token."""
    pool = []
    for token in sorted(tokenizer.get_vocab()):
        if not token.startswith("Ġ") or not WORD.fullmatch(token[1:]):
            continue
        if len(tokenizer(" " + token[1:], add_special_tokens=False)["input_ids"]) == 1:
            pool.append(token[1:])
        if len(pool) == size:
            break
    if len(pool) < 100:
        raise ValueError(f"{type(tokenizer).__name__}: only {len(pool)} single-token words found")
    return pool


def _text(rng: random.Random, pool: list[str], n: int) -> str:
    return "".join(" " + rng.choice(pool) for _ in range(n))


def rows(kind: str, p: dict[str, Any], tokenizer: Any) -> list[dict[str, str]]:
    """Enough rows for every step (each step takes fresh ones): prompt/chosen/rejected for DPO
    and the reward model, prompt only for GRPO."""
    rng = random.Random(p["seed"])
    pool = word_pool(tokenizer)
    n = p["batch_size"] * (p["warmup_steps"] + p["measured_steps"] + 1)
    prompt_len, completion_len = p["prompt_length"], p["completion_length"]
    out = []
    for _ in range(n):
        row = {"prompt": _text(rng, pool, prompt_len)}
        if kind != "grpo":
            row["chosen"] = _text(rng, pool, completion_len)
            row["rejected"] = _text(rng, pool, completion_len)
        out.append(row)
    first = out[0]
    got = len(tokenizer(first["prompt"], add_special_tokens=False)["input_ids"])
    if got != prompt_len:
        raise AssertionError(f"prompt tokenised to {got} tokens, not {prompt_len}")
    if kind != "grpo":
        got = len(tokenizer(first["prompt"] + first["chosen"], add_special_tokens=False)["input_ids"])
        if got != prompt_len + completion_len:
            raise AssertionError(f"prompt + chosen tokenised to {got} tokens, not {prompt_len + completion_len}")
    return out


def samples_per_step(kind: str, p: dict[str, Any]) -> int:
    """Pairs per step (DPO, reward model) or completions per step (GRPO)."""
    return p["batch_size"] * (p["num_generations"] if kind == "grpo" else 1)


def tokens_per_step(kind: str, p: dict[str, Any]) -> int:
    """Real (unpadded) tokens in one step's training sequences: both sequences of each pair,
    prompt + completion + EOS; for GRPO prompt + completion of each completion."""
    seq = p["prompt_length"] + p["completion_length"]
    if kind == "grpo":
        return samples_per_step(kind, p) * seq
    return samples_per_step(kind, p) * 2 * (seq + 1)


def max_length(p: dict[str, Any]) -> int:
    """Room for prompt + completion + EOS: nothing is truncated."""
    return p["prompt_length"] + p["completion_length"] + 8


def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    """GRPO's reward: a number in [0, 1) from a hash of the completion's text. Cheap, and
    different completions get different rewards, so no group is flat (a random model's
    completions would all score the same on any real criterion)."""
    return [zlib.crc32(str(completion).encode()) % 1000 / 1000 for completion in completions]
