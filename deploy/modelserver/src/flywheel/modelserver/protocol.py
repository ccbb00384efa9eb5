"""The OpenAI wire format (chat completions, and legacy completions with log-probabilities):
request validation and response bodies.

Unknown request fields are accepted and ignored (clients such as LiteLLM send extras);
fields we read are checked, and a bad one is a 400 whose message names it."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class RequestError(Exception):
    """A request the server will not run; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def _check_stops(v: str | list[str] | None) -> str | list[str] | None:
    stops = [v] if isinstance(v, str) else (v or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise ValueError("give at most 4 non-empty stop strings")
    return v


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The content as plain text (text parts joined; other part types are refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"content part of type {part.get('type')!r} is not supported; send text")
            parts.append(part["text"])
        return "".join(parts)


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: a named JSON schema the answer must follow
    (``strict`` and ``description`` are accepted; the schema is always enforced)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON
    object) or ``json_schema`` (an object following ``json_schema.schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object ({"name": ..., "schema": {...}})')
        return self


class ChatRequest(BaseModel):
    """The fields of a chat completions request this server honours."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    response_format: ResponseFormat | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return _check_stops(v)

    @model_validator(mode="after")
    def _one_limit(self) -> ChatRequest:
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def chat(self) -> list[dict[str, str]]:
        """Messages for the chat template ("developer" is the new name of "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


def parse_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body; raise RequestError naming every bad field."""
    return _validate(ChatRequest, body)


def _validate(model: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "body"
            problems.append(f"{where}: {err['msg']}")
        first = ".".join(str(p) for p in exc.errors()[0]["loc"]) if exc.errors() else None
        raise RequestError("invalid request: " + "; ".join(problems), param=first) from None


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    cid: str, model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_body(
    cid: str,
    model: str,
    delta: dict[str, str],
    finish_reason: str | None = None,
    usage_: dict[str, int] | None = None,
) -> dict[str, Any]:
    choices = [] if usage_ is not None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


# -- legacy completions (POST /v1/completions) -------------------------------------------------

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class CompletionRequest(BaseModel):
    """OpenAI's legacy completions request, with vLLM's ``prompt_logprobs``.

    ``echo`` returns the prompt before the completion (and, with ``logprobs``, the prompt's
    tokens and their log-probabilities, the first one null); ``max_tokens: 0`` scores the
    prompt without generating. ``logprobs`` (0-5, OpenAI) and ``prompt_logprobs`` (0-20, vLLM)
    count alternatives per position: the chosen token is always given as well."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    prompt: str | list[int] | list[str]
    max_tokens: int = Field(16, ge=0)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    stop: str | list[str] | None = None
    seed: int | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, v: bool) -> bool:
        if v:
            raise ValueError("streaming is not supported on /v1/completions; use /v1/chat/completions")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            if len(v) != 1:
                raise ValueError("give one prompt (a string, a list of one string, or a list of token ids)")
            v = v[0]
        if isinstance(v, list) and any(x < 0 for x in v):  # type: ignore[operator]
            raise ValueError("token ids must be non-negative")
        if not v:
            raise ValueError("the prompt is empty")
        return v  # type: ignore[return-value]

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return _check_stops(v)

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a decoded /v1/completions body; raise RequestError naming every bad field."""
    return _validate(CompletionRequest, body)


def text_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def text_completion_body(
    cid: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    logprobs: dict[str, Any] | None = None,
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None,
) -> dict[str, Any]:
    """An OpenAI ``text_completion`` body; ``prompt_logprobs`` sits in the choice, as vLLM puts it."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs
    return {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
