"""Generation, one request at a time.

A small model on a CPU gains little from batching, and PEFT switches adapters by mutating
the model, so every generation runs on one worker thread, in arrival order: the adapter
is selected right before ``generate`` on the thread that owns the model, and no two
requests ever see each other's adapter or random state. Streaming hands text chunks from
that thread to the event loop; a client that goes away stops its generation.

Adapters loaded or unloaded while the server runs (vLLM's runtime LoRA API) change the model
on that same thread, between two generations: a load waits for the generation before it,
and the generation after it sees the new adapter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.modelserver.loading import BaseModel
from flywheel.modelserver.protocol import ChatRequest, CompletionRequest, RequestError
from flywheel.modelserver.structured import Grammars, grammar_for, sampling_overrides

_END = object()
log = logging.getLogger(__name__)


class Cancel(threading.Event):
    """Set to stop a generation at its next token. ``client_gone``: why, when it was its
    client hanging up (a timed-out call), which the worker thread logs."""

    client_gone = False

    def client_left(self, model_name: str) -> None:
        if not self.client_gone:
            log.info("a request for %s was cancelled: its client went away", model_name)
        self.client_gone = True
        self.set()


@dataclass
class Prepared:
    """A validated request, tokenised and bound to a served model."""

    model_name: str
    adapter: str | None
    input_ids: Any
    max_new_tokens: int
    request: ChatRequest | CompletionRequest
    grammar: str | None = None  # the response_format to enforce (llguidance grammar), if any


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)  # as generated (special tokens included)


@dataclass
class TokenScores:
    """Log-probabilities of a token sequence under the served model, position by position:
    entry i scores ``token_ids[i]`` given the tokens before it (None for the first token)."""

    token_ids: list[int]
    logprobs: list[float | None]
    ranks: list[int | None]  # 1 = the model's most likely token there
    top: list[list[tuple[int, float]] | None]  # the ``top_k`` most likely tokens, best first


@dataclass
class Scored:
    """A legacy completion: the generation, and the scores of prompt + completion tokens
    (``scores`` None when the request asked for no log-probabilities)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    generation: Generation
    scores: TokenScores | None


class Engine:
    """The base model plus its adapters, and the one thread that runs them."""

    def __init__(
        self, base: BaseModel, adapters: dict[str, Path], *, max_tokens_cap: int = 512, max_adapters: int = 8
    ) -> None:
        self.base = base
        self.tokenizer = base.tokenizer
        # Served name -> where it came from; changed on the event loop's thread only.
        self.adapters: dict[str, str] = {}
        self.max_tokens_cap = max_tokens_cap
        self.max_adapters = max(max_adapters, len(adapters))
        self.context_length = int(getattr(base.model.config, "max_position_embeddings", 2048) or 2048)
        self.model = base.model
        self._peft = False  # whether self.model is a PeftModel (it is while any adapter is loaded)
        self._reserved: set[str] = set()
        for name, path in adapters.items():
            self._attach(name, Path(path))
            self.adapters[name] = str(path)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="generate")
        eos = base.model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(self.tokenizer.eos_token_id)
        self.grammars = Grammars(self.tokenizer, int(base.model.config.vocab_size), eos_ids)

    def model_names(self) -> list[str]:
        return [self.base.name, *self.adapters]

    @contextlib.contextmanager
    def reserve(self, name: str) -> Any:
        """Hold ``name`` for a load about to happen: RequestError (400) if it is the base
        model's name, already served, being loaded, or the server is full (``max_adapters``:
        a full server refuses rather than evicting an adapter that may be taking traffic)."""
        if name == self.base.name or name in self.adapters or name in self._reserved:
            raise RequestError(
                f"lora_name {name!r}: a model of that name is already served (or being loaded)",
                param="lora_name",
                code="lora_already_loaded",
            )
        if len(self.adapters) + len(self._reserved) >= self.max_adapters:
            raise RequestError(
                f"this server already holds {self.max_adapters} adapters (--max-loras); unload one first "
                f"(loaded: {', '.join(self.adapters)})",
                param="lora_name",
                code="too_many_loras",
            )
        self._reserved.add(name)
        try:
            yield
        finally:
            self._reserved.discard(name)

    async def load_adapter(self, name: str, folder: Path, *, source: str) -> None:
        """Serve the LoRA adapter in ``folder`` as model ``name`` (inside ``reserve(name)``).
        The model changes on the worker thread, between generations; RequestError (400) if
        PEFT cannot load it onto this base model (the model is left as it was)."""
        if name not in self._reserved:
            raise RuntimeError(f"load_adapter({name!r}) outside reserve({name!r})")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._attach, name, folder)
        except Exception as exc:  # noqa: BLE001 - PEFT raises many kinds; the client needs the message
            raise RequestError(
                f"lora_path {source!r}: could not load the adapter onto {self.base.name}: {exc}",
                param="lora_path",
                code="lora_load_failed",
            ) from None
        self.adapters[name] = source

    async def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (404 if it is not served). Requests already queued
        for it are answered 404 when their turn comes."""
        if name not in self.adapters:
            raise RequestError(
                f"lora_name {name!r} is not loaded; loaded adapters: {', '.join(self.adapters) or 'none'}",
                status=404,
                param="lora_name",
                code="lora_not_found",
            )
        del self.adapters[name]  # new requests for it are refused from now on
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._worker, self._detach, name)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _bind(self, model: str) -> str | None:
        """The adapter serving ``model`` (None: the base model); 404 if none does."""
        if model == self.base.name:
            return None
        if model in self.adapters:
            return model
        raise RequestError(
            f"model {model!r} is not served here; served models: {', '.join(self.model_names())}",
            status=404,
            param="model",
            code="model_not_found",
        )

    def prepare(self, request: ChatRequest) -> Prepared:
        """Bind the request to a model and tokenise it; RequestError if it cannot run."""
        adapter = self._bind(request.model)
        ids = self.tokenizer.apply_chat_template(
            request.chat(), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        room = self.context_length - ids.shape[1]
        if room < 1:
            raise RequestError(
                f"the prompt is {ids.shape[1]} tokens; this model's context is {self.context_length}", param="messages"
            )
        wanted = request.max_tokens or min(self.max_tokens_cap, room)
        if wanted > min(self.max_tokens_cap, room):
            raise RequestError(
                f"max_tokens {wanted} is more than this server allows here "
                f"({min(self.max_tokens_cap, room)}: cap {self.max_tokens_cap}, context room {room})",
                param="max_tokens",
            )
        return Prepared(request.model, adapter, ids, wanted, request, grammar_for(request.response_format))

    def prepare_completion(self, request: CompletionRequest) -> Prepared:
        """Bind a legacy completions request to a model and tokenise its prompt as vLLM does
        (the tokenizer's special tokens added); RequestError if it cannot run. ``max_tokens``
        0 is allowed: the prompt is only scored."""
        adapter = self._bind(request.model)
        import torch

        if isinstance(request.prompt, str):
            ids = list(self.tokenizer(request.prompt)["input_ids"])
        else:
            vocab = int(self.base.model.config.vocab_size)
            bad = [t for t in request.prompt if t >= vocab]
            if bad:
                raise RequestError(
                    f"prompt: token ids {bad[:5]} are outside this model's vocabulary ({vocab})", param="prompt"
                )
            ids = list(request.prompt)
        if not ids:
            raise RequestError("prompt: the prompt has no tokens", param="prompt")
        room = self.context_length - len(ids)
        if room < 0:
            raise RequestError(
                f"the prompt is {len(ids)} tokens; this model's context is {self.context_length}", param="prompt"
            )
        allowed = min(self.max_tokens_cap, room)
        if request.max_tokens > allowed:
            raise RequestError(
                f"max_tokens {request.max_tokens} is more than this server allows here "
                f"({allowed}: cap {self.max_tokens_cap}, context room {room})",
                param="max_tokens",
            )
        grammar = grammar_for(request.response_format)
        return Prepared(request.model, adapter, torch.tensor([ids]), request.max_tokens, request, grammar)

    async def complete_scored(self, prepared: Prepared, *, top_k: int | None) -> Scored:
        """Generate ``prepared.max_new_tokens`` tokens (none for 0), then, with ``top_k`` not
        None, score prompt + completion in one forward pass on the worker thread with the
        request's adapter (raw model log-probabilities, before temperature or top-p)."""
        loop = asyncio.get_running_loop()
        cancel = Cancel()
        try:
            return await loop.run_in_executor(self._worker, self._complete_scored, prepared, cancel, top_k)
        except asyncio.CancelledError:
            cancel.client_left(prepared.model_name)
            raise
        finally:
            cancel.set()

    async def complete(self, prepared: Prepared) -> Generation:
        """Generate the whole answer."""
        loop = asyncio.get_running_loop()
        cancel = Cancel()
        try:
            return await loop.run_in_executor(self._worker, self._generate, prepared, cancel, None)
        except asyncio.CancelledError:
            # The server cancels a request whose client hung up (handler_cancellation): the
            # generation stops at its next token and the worker takes the next request.
            cancel.client_left(prepared.model_name)
            raise
        finally:
            cancel.set()

    async def stream(self, prepared: Prepared) -> AsyncIterator[str | Generation]:
        """Yield text chunks as they are generated, then the finished Generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = Cancel()

        def push(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        future = loop.run_in_executor(self._worker, self._generate, prepared, cancel, push)
        stops = prepared.request.stop_list()
        sent, text = 0, ""
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                text += item
                cut = _first_stop(text, stops)
                # Hold back a tail that could be the start of a stop string.
                safe = cut if cut is not None else len(text) - max((len(s) - 1 for s in stops), default=0)
                if safe > sent:
                    yield text[sent:safe]
                    sent = safe
                if cut is not None:
                    cancel.set()
            generation = await future
            if len(generation.text) > sent:
                yield generation.text[sent:]
            finished = True
            yield generation
        finally:
            if not finished:  # the consumer stopped early: the client hung up mid-stream
                cancel.client_left(prepared.model_name)
            cancel.set()
            if not future.done():
                with contextlib.suppress(Exception):
                    await future

    # -- on the worker thread ------------------------------------------------------------------
    def _attach(self, name: str, folder: Path) -> None:
        from peft import MODEL_TYPE_TO_PEFT_MODEL_MAPPING, PeftConfig, PeftModel

        if not self._peft:
            # As PeftModel.from_pretrained does it, in two steps, so a failed load can be undone.
            config = PeftConfig.from_pretrained(str(folder))
            config.inference_mode = True
            wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type, PeftModel)
            model = wrapper(self.base.model, config, adapter_name=name)
            try:
                model.load_adapter(str(folder), adapter_name=name)
            except Exception:
                model.base_model.unload()  # takes the injected LoRA layers out of the base model again
                raise
            self.model, self._peft = model, True
        else:
            try:
                self.model.load_adapter(str(folder), adapter_name=name)
            except Exception:
                if name in self.model.peft_config:
                    self.model.delete_adapter(name)
                raise
        self.model.eval()

    def _detach(self, name: str) -> None:
        if list(self.model.peft_config) == [name]:
            # The last adapter: back to the plain base model (its layers restored in place).
            self.model, self._peft = self.model.base_model.unload(), False
        else:
            self.model.delete_adapter(name)

    def _generate(self, prepared: Prepared, cancel: Cancel, push: Any) -> Generation:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

        request = prepared.request

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

        streamer = None
        if push is not None:

            class Push(TextStreamer):
                def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                    if text:
                        push(text)

            streamer = Push(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        try:
            if cancel.is_set():  # the client left while the request waited its turn
                return Generation("", int(prepared.input_ids.shape[1]), 0, "stop")
            started = time.monotonic()
            if request.seed is not None:
                torch.manual_seed(request.seed)
            sampling: dict[str, Any] = {"do_sample": False}
            if request.temperature > 0:
                sampling = {"do_sample": True, "temperature": request.temperature, "top_p": request.top_p}
            stops = request.stop_list()
            processors = None
            if prepared.grammar is not None:
                processors = self.grammars.processors(
                    prepared.grammar,
                    prompt_len=int(prepared.input_ids.shape[1]),
                    temperature=request.temperature,
                    top_p=request.top_p,
                )
                sampling = sampling_overrides(request.temperature, request.top_p)
            with self._adapter(prepared.adapter), torch.inference_mode():
                input_ids = prepared.input_ids.to(self.base.device)
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=prepared.max_new_tokens,
                    stopping_criteria=StoppingCriteriaList([Cancelled()]),
                    logits_processor=processors,
                    stop_strings=stops or None,
                    tokenizer=self.tokenizer if stops else None,
                    streamer=streamer,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **sampling,
                )
            new = out[0][input_ids.shape[1] :].tolist()
            if cancel.client_gone:
                log.info(
                    "stopped generating for %s after %d of %d tokens (%.1f s): its client went away",
                    prepared.model_name,
                    len(new),
                    prepared.max_new_tokens,
                    time.monotonic() - started,
                )
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            cut = _first_stop(text, stops)
            eos = self.tokenizer.eos_token_id
            ended = cut is not None or (bool(new) and new[-1] == eos) or len(new) < prepared.max_new_tokens
            return Generation(
                text=text if cut is None else text[:cut],
                prompt_tokens=int(input_ids.shape[1]),
                completion_tokens=len(new),
                finish_reason="stop" if ended else "length",
                token_ids=new,
            )
        finally:
            if push is not None:
                push(_END)

    def _complete_scored(self, prepared: Prepared, cancel: Cancel, top_k: int | None) -> Scored:
        prompt_ids = prepared.input_ids[0].tolist()
        if prepared.max_new_tokens > 0:
            generation = self._generate(prepared, cancel, None)
        else:
            generation = Generation("", len(prompt_ids), 0, "length")
        completion_ids = self._visible(generation)
        scores = None
        if top_k is not None:
            scores = self._score(prepared.adapter, prompt_ids + completion_ids, top_k)
        return Scored(prompt_ids, completion_ids, generation, scores)

    def _visible(self, generation: Generation) -> list[int]:
        """The generated tokens behind ``generation.text``: special tokens dropped, and after a
        stop string only as many as reach the text's end (the last may run past it)."""
        special = set(self.tokenizer.all_special_ids)
        ids = [t for t in generation.token_ids if t not in special]
        if len(self.tokenizer.decode(ids)) <= len(generation.text):
            return ids
        for n in range(len(ids) + 1):
            if len(self.tokenizer.decode(ids[:n])) >= len(generation.text):
                return ids[:n]
        return ids

    def _score(self, adapter: str | None, ids: list[int], top_k: int, chunk: int = 512) -> TokenScores:
        import torch

        with self._adapter(adapter), torch.inference_mode():
            input_ids = torch.tensor([ids], device=self.base.device)
            logits = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0]
            logprobs: list[float | None] = [None]
            ranks: list[int | None] = [None]
            top: list[list[tuple[int, float]] | None] = [None]
            targets = input_ids[0, 1:]
            # Position by position in chunks: a full [tokens x vocab] float32 table can be large.
            for start in range(0, len(ids) - 1, chunk):
                logp = torch.log_softmax(logits[start : start + chunk][: len(ids) - 1 - start].float(), dim=-1)
                want = targets[start : start + logp.shape[0]]
                chosen = logp.gather(1, want[:, None])[:, 0]
                logprobs += chosen.tolist()
                ranks += ((logp > chosen[:, None]).sum(dim=-1) + 1).tolist()
                if top_k > 0:
                    values, indices = logp.topk(top_k, dim=-1)
                    pairs = zip(indices.tolist(), values.tolist(), strict=True)
                    top += [list(zip(i, v, strict=True)) for i, v in pairs]
                else:
                    top += [[] for _ in range(logp.shape[0])]
        return TokenScores(ids, logprobs, ranks, top)

    def token_pieces(self, ids: list[int], text: str | None = None) -> list[str]:
        """The text of each token, such that the pieces joined give the decoded text (or
        ``text``, when ``ids`` are its tokens): a leading space belongs to its token, and a
        character split over several byte-level tokens goes to the one that completes it."""
        if text is not None:
            enc = self.tokenizer(text, return_offsets_mapping=True)
            if list(enc["input_ids"]) == list(ids) and "offset_mapping" in enc:
                pieces, end = [], 0
                for _, stop in enc["offset_mapping"]:
                    pieces.append(text[end:stop] if stop > end else "")
                    end = max(end, stop)
                if end == len(text):
                    return pieces
        pieces, done = [], ""
        for n in range(1, len(ids) + 1):
            now = self.tokenizer.decode(ids[:n])
            if now.endswith("\ufffd") or not now.startswith(done):
                pieces.append("")  # an incomplete character: it shows up with a later token
                continue
            pieces.append(now[len(done) :])
            done = now
        return pieces

    @contextlib.contextmanager
    def _adapter(self, name: str | None) -> Any:
        if name is not None and (not self._peft or name not in self.model.peft_config):
            raise RequestError(
                f"model {name!r} was unloaded while the request waited",
                status=404,
                param="model",
                code="model_not_found",
            )
        if not self._peft:
            yield
        elif name is None:
            with self.model.disable_adapter():
                yield
        else:
            self.model.set_adapter(name)
            yield


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
