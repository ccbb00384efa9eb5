"""Generation, one request at a time.

A small model on a CPU gains little from batching, and PEFT switches adapters by mutating
the model, so every generation runs on one worker thread, in arrival order: the adapter
is selected right before ``generate`` on the thread that owns the model, and no two
requests ever see each other's adapter or random state. Streaming hands text chunks from
that thread to the event loop; a client that goes away stops its generation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.modelserver.loading import BaseModel
from flywheel.modelserver.protocol import ChatRequest, RequestError

_END = object()


@dataclass
class Prepared:
    """A validated request, tokenised and bound to a served model."""

    model_name: str
    adapter: str | None
    input_ids: Any
    max_new_tokens: int
    request: ChatRequest


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Engine:
    """The base model plus its adapters, and the one thread that runs them."""

    def __init__(self, base: BaseModel, adapters: dict[str, Path], *, max_tokens_cap: int = 512) -> None:
        self.base = base
        self.tokenizer = base.tokenizer
        self.adapters = dict(adapters)
        self.max_tokens_cap = max_tokens_cap
        self.context_length = int(getattr(base.model.config, "max_position_embeddings", 2048) or 2048)
        self.model = base.model
        if adapters:
            from peft import PeftModel

            (first, path), *rest = adapters.items()
            self.model = PeftModel.from_pretrained(base.model, str(path), adapter_name=first)
            for name, extra in rest:
                self.model.load_adapter(str(extra), adapter_name=name)
            self.model.eval()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="generate")

    def model_names(self) -> list[str]:
        return [self.base.name, *self.adapters]

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def prepare(self, request: ChatRequest) -> Prepared:
        """Bind the request to a model and tokenise it; RequestError if it cannot run."""
        if request.model == self.base.name:
            adapter = None
        elif request.model in self.adapters:
            adapter = request.model
        else:
            raise RequestError(
                f"model {request.model!r} is not served here; served models: {', '.join(self.model_names())}",
                status=404,
                param="model",
                code="model_not_found",
            )
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
        return Prepared(request.model, adapter, ids, wanted, request)

    async def complete(self, prepared: Prepared) -> Generation:
        """Generate the whole answer."""
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        try:
            return await loop.run_in_executor(self._worker, self._generate, prepared, cancel, None)
        finally:
            cancel.set()  # a cancelled request stops its generation if it is already running

    async def stream(self, prepared: Prepared) -> AsyncIterator[str | Generation]:
        """Yield text chunks as they are generated, then the finished Generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def push(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        future = loop.run_in_executor(self._worker, self._generate, prepared, cancel, push)
        stops = prepared.request.stop_list()
        sent, text = 0, ""
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
            yield generation
        finally:
            cancel.set()
            if not future.done():
                with contextlib.suppress(Exception):
                    await future

    # -- on the worker thread ------------------------------------------------------------------
    def _generate(self, prepared: Prepared, cancel: threading.Event, push: Any) -> Generation:
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
            if request.seed is not None:
                torch.manual_seed(request.seed)
            sampling: dict[str, Any] = {"do_sample": False}
            if request.temperature > 0:
                sampling = {"do_sample": True, "temperature": request.temperature, "top_p": request.top_p}
            stops = request.stop_list()
            with self._adapter(prepared.adapter), torch.inference_mode():
                input_ids = prepared.input_ids.to(self.base.device)
                out = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=prepared.max_new_tokens,
                    stopping_criteria=StoppingCriteriaList([Cancelled()]),
                    stop_strings=stops or None,
                    tokenizer=self.tokenizer if stops else None,
                    streamer=streamer,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **sampling,
                )
            new = out[0][input_ids.shape[1] :].tolist()
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            cut = _first_stop(text, stops)
            eos = self.tokenizer.eos_token_id
            ended = cut is not None or (bool(new) and new[-1] == eos) or len(new) < prepared.max_new_tokens
            return Generation(
                text=text if cut is None else text[:cut],
                prompt_tokens=int(input_ids.shape[1]),
                completion_tokens=len(new),
                finish_reason="stop" if ended else "length",
            )
        finally:
            if push is not None:
                push(_END)

    @contextlib.contextmanager
    def _adapter(self, name: str | None) -> Any:
        if not self.adapters:
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
