"""What an RLP step reads and writes about a run: its search space (the fingerprint that
groups runs sharing one experience buffer, the parameters a proposal must fit), its history
from the optimizer's candidates, and the prompt ("the context") the thoughts are written for.

The context is one text: the chat messages rendered with role headers. The same text is
the prefix whose information gain is measured and the ``prompt`` column of the GRPO dataset,
so what the policy is trained on is exactly what it was asked."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from flywheel.society.rlp.thoughts import build_prompt

# Few-shot examples are cut to this many characters each, so the prompt stays bounded.
EXAMPLE_CHARS = 600
OUTCOME_CHARS = 300


def space_fingerprint(search_space: Any) -> str:
    """sha256 of the canonical JSON of a run's ``search_space`` section: runs over the same
    space share one experience buffer and one reasoning policy."""
    canonical = json.dumps(search_space, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def space_parameters(search_space: Any) -> dict[str, Any]:
    """Parameter name -> its declaration (``search_space.parameters``, or the section itself
    when it lists parameters directly)."""
    if not isinstance(search_space, Mapping):
        return {}
    params = search_space.get("parameters", search_space)
    return dict(params) if isinstance(params, Mapping) else {}


def canonical_value(value: Any) -> Any:
    """Numbers as the optimizer's Struct gives them back (all doubles) compare equal to the
    ints that were proposed: integral floats become ints, others keep 10 significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if float(value).is_integer():
        return int(value)
    return float(f"{value:.10g}")


def params_key(params: Mapping[str, Any]) -> str:
    """A config's identity for matching a proposal to the candidate the optimizer made of it."""
    return json.dumps(
        {k: canonical_value(v) for k, v in params.items()}, sort_keys=True, separators=(",", ":"), default=str
    )


def history_of(candidates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run's evaluated candidates as ``build_prompt`` takes them (score = mean so far)."""
    return [
        {"params": dict(c.get("params") or {}), "score": round(float(c.get("score", 0.0)), 4)}
        for c in candidates
        if int(c.get("cases", 0)) > 0
    ]


def render_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages as one text with role headers (the context string)."""
    return "\n\n".join(f"<|{m['role']}|>\n{m['content'].strip()}" for m in messages) + "\n\n<|assistant|>\n"


def build_context(
    *,
    history: Sequence[Mapping[str, Any]],
    search_space: Mapping[str, Any],
    n_thoughts: int,
    proposals_per_thought: int,
    examples: Sequence[Mapping[str, str]] = (),
    max_history: int = 20,
) -> tuple[list[dict[str, str]], str]:
    """(chat messages for the reasoning model, the context text). ``examples``: earlier
    thoughts on this space and what happened (``{"thought", "outcome"}``, best-rewarded first),
    shown before the question so the policy imitates the ones that predicted well."""
    messages = build_prompt(
        history=history,
        search_space=search_space,
        n_thoughts=n_thoughts,
        proposals_per_thought=proposals_per_thought,
        max_history=max_history,
    )
    if examples:
        shown = [
            f"Example {i}. Earlier thought: {_cut(e['thought'], EXAMPLE_CHARS)}\n"
            f"What happened: {_cut(e['outcome'], OUTCOME_CHARS)}"
            for i, e in enumerate(examples, start=1)
        ]
        block = "Earlier thoughts on this search space that predicted the results well:\n" + "\n".join(shown)
        messages[-1] = {"role": "user", "content": block + "\n\n" + messages[-1]["content"]}
    return messages, render_messages(messages)


def _cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
