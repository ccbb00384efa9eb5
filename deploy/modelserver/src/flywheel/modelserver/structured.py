"""OpenAI's ``response_format`` enforced while generating, with llguidance.

``json_object`` and ``json_schema`` become an llguidance grammar (compact JSON: no whitespace
between tokens, so a small model cannot idle in blanks). Before each token the grammar's
allowed-token mask is applied to the logits; the model then samples only tokens that keep
the answer a prefix of a valid document, and once the document is complete only the end
token. An answer cut by ``max_tokens`` is still a prefix, not a document (``finish_reason``
``length``), as with OpenAI.

llguidance is imported only when a request asks for a format, and the tokenizer is converted
for it once (about a second) on the first such request: unconstrained requests cost nothing.

Sampling: transformers appends custom logits processors *after* its own temperature/top-k/
top-p warpers, and a top-k that keeps only tokens the grammar forbids leaves nothing to
sample. So a constrained request masks first, then applies the same warpers itself, and
turns generate's own warpers off (``sampling_overrides``)."""

from __future__ import annotations

import json
import threading
from typing import Any

from flywheel.modelserver.protocol import RequestError, ResponseFormat

# Compact JSON: "," and ":" with no whitespace around them.
COMPILE_OPTIONS = {"whitespace_flexible": False}
DEFAULT_TOP_K = 50  # transformers' default, which unconstrained sampling gets too
SCHEMA_PARAM = "response_format.json_schema.schema"


def grammar_for(response_format: ResponseFormat | None) -> str | None:
    """The llguidance grammar for ``response_format`` (None: no constraint). RequestError
    (400) naming the field for a schema llguidance cannot enforce (unknown keywords such as
    ``not``, a wrong ``type``, an unsatisfiable range...)."""
    if response_format is None or response_format.type == "text":
        return None
    from llguidance import LLMatcher

    schema: Any = {"type": "object"}
    if response_format.type == "json_schema":
        assert response_format.json_schema is not None  # the protocol checks it
        given = response_format.json_schema.json_schema
        schema = {"type": "object"} if given is None else given
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=COMPILE_OPTIONS)  # type: ignore[arg-type]
        error = LLMatcher.validate_grammar(grammar)
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error:
        raise RequestError(
            f"{SCHEMA_PARAM}: this server cannot enforce the schema: {error}",
            param=SCHEMA_PARAM,
            code="unsupported_schema",
        )
    return grammar


def sampling_overrides(temperature: float, top_p: float) -> dict[str, Any]:
    """``generate`` arguments for a constrained request: greedy stays greedy; sampling turns
    transformers' warpers off (``GrammarMask`` applies them after the mask)."""
    if temperature <= 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


class Grammars:
    """llguidance's view of one tokenizer (built once, on first use) and the logits
    processors that enforce a grammar with it."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = eos_ids
        self._lltokenizer: Any = None
        self._lock = threading.Lock()

    def _llt(self) -> Any:
        with self._lock:
            if self._lltokenizer is None:
                import llguidance.hf

                n_vocab = max(self._vocab_size, len(self._tokenizer))
                self._lltokenizer = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=n_vocab, eos_token=self._eos_ids or None
                )
            return self._lltokenizer

    def processors(self, grammar: str, *, prompt_len: int, temperature: float, top_p: float) -> Any:
        """A LogitsProcessorList: the grammar's mask, then (when sampling) temperature, top-k
        and top-p, in transformers' order."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        out = LogitsProcessorList([GrammarMask(self._llt(), grammar, prompt_len)])
        if temperature > 0:
            if temperature != 1.0:
                out.append(TemperatureLogitsWarper(temperature))
            out.append(TopKLogitsWarper(DEFAULT_TOP_K))
            if top_p < 1.0:
                out.append(TopPLogitsWarper(top_p))
        return out


class GrammarMask:
    """A transformers logits processor for one generation (batch of one): feeds the last
    sampled token to the grammar, then sets every token it forbids to -inf."""

    def __init__(self, lltokenizer: Any, grammar: str, prompt_len: int) -> None:
        import torch
        from llguidance import LLMatcher
        from llguidance.torch import allocate_token_bitmask

        self.matcher = LLMatcher(lltokenizer, grammar, log_level=0)
        if self.matcher.is_error():  # validated at request time; a tokenizer-specific failure
            raise RequestError(f"{SCHEMA_PARAM}: {self.matcher.get_error()}", param=SCHEMA_PARAM)
        self._prompt_len = prompt_len
        self._bitmask = allocate_token_bitmask(1, lltokenizer.vocab_size)
        self._bits = torch.arange(32, dtype=torch.int32)
        self._eos = list(lltokenizer.eos_tokens)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch
        from llguidance.torch import fill_next_token_bitmask

        if input_ids.shape[1] > self._prompt_len:
            # Only allowed tokens are sampled, so this fails only after the end token.
            self.matcher.consume_token(int(input_ids[0, -1]))
        if self.matcher.is_error():
            allowed = torch.zeros(scores.shape[1], dtype=torch.bool, device=scores.device)
            allowed[self._eos] = True
        else:
            fill_next_token_bitmask(self.matcher, self._bitmask)
            unpacked = (self._bitmask[0].unsqueeze(1) >> self._bits) & 1  # [words, 32], low bit first
            allowed = unpacked.flatten()[: scores.shape[1]].bool().to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))
