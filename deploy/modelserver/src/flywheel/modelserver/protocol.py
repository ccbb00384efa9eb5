"""The OpenAI chat completions wire format: request validation and response bodies.

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

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("give at most 4 non-empty stop strings")
        return v

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
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return ChatRequest.model_validate(body)
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
