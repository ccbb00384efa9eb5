"""``POST /v1/completions`` answers: OpenAI's legacy ``logprobs`` object (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``; with ``echo`` the prompt's tokens come
first and the first one's log-probability is null) and vLLM's ``prompt_logprobs`` (a list
aligned with the prompt tokens, first entry null, each a ``{token_id: {logprob, rank,
decoded_token}}`` map holding the prompt token and the top alternatives).

``text_offset`` counts characters into the choice's ``text`` (the prompt included when
echoed). Log-probabilities are the model's own (raw logits, before temperature or top-p)."""

from __future__ import annotations

from typing import Any

from flywheel.modelserver.engine import Engine, Scored
from flywheel.modelserver.protocol import CompletionRequest, text_completion_body


def wanted_top_k(request: CompletionRequest) -> int | None:
    """How many alternatives to compute per position (None: no scoring at all)."""
    asked = [k for k in (request.logprobs, request.prompt_logprobs) if k is not None]
    return max(asked) if asked else None


def completion_answer(engine: Engine, request: CompletionRequest, scored: Scored, cid: str) -> dict[str, Any]:
    """The ``text_completion`` body for ``request``, given what the engine generated and scored."""
    gen = scored.generation
    prompt_text = request.prompt if isinstance(request.prompt, str) else engine.tokenizer.decode(scored.prompt_ids)
    text = (prompt_text if request.echo else "") + gen.text
    n_prompt = len(scored.prompt_ids)
    logprobs = None
    if request.logprobs is not None and scored.scores is not None:
        pieces = engine.token_pieces(scored.completion_ids)
        first = 0
        if request.echo:
            pieces = engine.token_pieces(scored.prompt_ids, prompt_text) + pieces
        else:
            first = n_prompt
        logprobs = _openai_logprobs(engine, scored, pieces, first, request.logprobs)
    prompt_logprobs = None
    if request.prompt_logprobs is not None and scored.scores is not None:
        prompt_logprobs = _vllm_prompt_logprobs(engine, scored, n_prompt, request.prompt_logprobs)
    return text_completion_body(
        cid,
        request.model,
        text,
        gen.finish_reason,
        n_prompt,
        len(scored.completion_ids),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def _openai_logprobs(engine: Engine, scored: Scored, pieces: list[str], first: int, k: int) -> dict[str, Any]:
    scores = scored.scores
    assert scores is not None
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    top: list[dict[str, float] | None] = []
    for i in range(first, len(scores.token_ids)):
        if scores.logprobs[i] is None:
            top.append(None)
            continue
        # The chosen token is always there, as OpenAI and vLLM give it.
        alternatives = {engine.tokenizer.decode([t]): lp for t, lp in (scores.top[i] or [])[:k]}
        alternatives.setdefault(pieces[i - first], scores.logprobs[i])  # type: ignore[arg-type]
        top.append(alternatives)
    return {
        "tokens": pieces,
        "token_logprobs": scores.logprobs[first:],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _vllm_prompt_logprobs(
    engine: Engine, scored: Scored, n_prompt: int, k: int
) -> list[dict[str, dict[str, Any]] | None]:
    scores = scored.scores
    assert scores is not None
    out: list[dict[str, dict[str, Any]] | None] = []
    for i in range(n_prompt):
        if scores.logprobs[i] is None:
            out.append(None)
            continue
        token = scores.token_ids[i]
        entry = {
            str(token): {
                "logprob": scores.logprobs[i],
                "rank": scores.ranks[i],
                "decoded_token": engine.tokenizer.decode([token]),
            }
        }
        for rank, (alt, lp) in enumerate((scores.top[i] or [])[:k], start=1):
            entry.setdefault(str(alt), {"logprob": lp, "rank": rank, "decoded_token": engine.tokenizer.decode([alt])})
        out.append(entry)
    return out
