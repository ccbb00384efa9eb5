"""The SAO library's policy model (:class:`flywheel.society.sao.Llm`) as SmolLM2-135M-Instruct
in this process, with concurrent calls batched.

The SAO round keeps ``batch_size`` calls in flight; the local model server answers one
request at a time (its engine's design), which on 2 shared cores gives a few tokens a second.
So, as ``bench/learning`` does, the bench loads the same weights through the model server's
loader (``bench/learning/generate.py``) and answers the calls that are waiting together, in
one batched ``generate`` per (temperature, max_tokens).

One call is answered differently: the model's own ranking of two responses (the paper's
"ranking: X > Y"). SmolLM2-135M never writes that line when asked (0 of 8 in a probe: it
rambles or repeats the instructions), so every pair would be dropped as
``unparsable_ranking``. Instead the model's choice is read from its log-probabilities: after
the ranking request and the assistant's "ranking:", the more probable of the letters " A" and
" B" is its answer, returned as "ranking: A > B" or "ranking: B > A" (a forced choice, as
multiple-choice evaluations of small models do). The count of each letter is kept, so its
position bias is visible."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learning"))

# bench/learning/generate.py: batched generation from the model server's weights.
import generate

from flywheel.society.sao.judge import ranking_messages

# The fixed opening of the library's ranking request: how a call is recognised as one.
RANKING_OPENING = ranking_messages("", "", "")[0]["content"].split("[Prompt]")[0]


@dataclass
class _Call:
    messages: list[dict[str, str]]
    temperature: float
    max_tokens: int
    done: asyncio.Future[str]


@dataclass
class BatchedLlm:
    """An :class:`~flywheel.society.sao.Llm` over a loaded ``generate.Generator``.

    Calls wait ``linger_s`` for company, then every waiting call with the same sampling
    settings goes into one batch (at most ``max_batch``); batches run one at a time on a
    worker thread. ``seed`` makes the sampled batches reproducible for a given order of calls."""

    gen: Any
    seed: int = 0
    max_batch: int = 64
    linger_s: float = 0.05
    calls: int = 0
    batches: int = 0
    generated_tokens: int = 0
    ranking_letters: Counter[str] = field(default_factory=Counter)
    _queue: list[_Call] = field(default_factory=list)
    _worker: asyncio.Task[None] | None = None

    async def complete(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        loop = asyncio.get_running_loop()
        call = _Call(messages, temperature, max_tokens, loop.create_future())
        self._queue.append(call)
        self.calls += 1
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await call.done

    async def _drain(self) -> None:
        while self._queue:
            await asyncio.sleep(self.linger_s)
            first = self._queue[0]
            key = (is_ranking(first.messages), first.temperature, first.max_tokens)
            batch = [c for c in self._queue if (is_ranking(c.messages), c.temperature, c.max_tokens) == key][
                : self.max_batch
            ]
            taken = {id(c) for c in batch}
            self._queue = [c for c in self._queue if id(c) not in taken]
            self.batches += 1
            try:
                if key[0]:
                    texts = await asyncio.to_thread(self._rank, [c.messages for c in batch])
                else:
                    texts = await asyncio.to_thread(self._generate, batch, key[1], key[2])
            except Exception as exc:  # noqa: BLE001 - each call fails as the library expects (llm_error)
                for c in batch:
                    if not c.done.done():
                        c.done.set_exception(exc)
                continue
            for c, text in zip(batch, texts, strict=True):
                if not c.done.done():
                    c.done.set_result(text)

    def _generate(self, batch: list[_Call], temperature: float, max_tokens: int) -> list[str]:
        out = generate.generate(
            self.gen,
            [c.messages for c in batch],
            temperature=temperature,
            max_new_tokens=max_tokens,
            batch_prompts=len(batch),
            seed=self.seed * 100_003 + self.batches,
        )
        texts = [o[0] for o in out]
        self.generated_tokens += sum(len(self.gen.tokenizer(t).input_ids) for t in texts)
        return texts

    def _rank(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        letters = forced_choice(self.gen, conversations, prefix="ranking:", options=(" A", " B"))
        self.ranking_letters.update(letters)
        return [f"ranking: {x.strip()} > {'B' if x.strip() == 'A' else 'A'}" for x in letters]


def is_ranking(messages: list[dict[str, str]]) -> bool:
    return bool(messages) and messages[-1]["content"].startswith(RANKING_OPENING)


def forced_choice(
    gen: Any, conversations: list[list[dict[str, str]]], *, prefix: str, options: tuple[str, ...], chunk: int = 16
) -> list[str]:
    """For each conversation, the option whose first token the model finds likeliest right
    after the assistant has written ``prefix`` (one forward pass, batched, left-padded)."""
    import torch

    tok = gen.tokenizer
    ids = [tok(o, add_special_tokens=False).input_ids[0] for o in options]
    if len(set(ids)) != len(ids):
        raise ValueError(f"options {options}: their first tokens coincide")
    picks: list[int] = []
    for start in range(0, len(conversations), chunk):
        texts = [generate.chat_text(gen, c) + prefix for c in conversations[start : start + chunk]]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        # Left padding: positions count from each row's first real token.
        positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = gen.model(**enc, position_ids=positions, logits_to_keep=1).logits[:, -1, :]
        picks += logits[:, ids].argmax(dim=-1).tolist()
    return [options[i] for i in picks]
