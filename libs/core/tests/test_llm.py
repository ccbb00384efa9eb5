"""flywheel.core.llm against a real local HTTP server speaking the OpenAI chat API,
scripted to fail: a 500 is retried, a hung server hits the timeout, the key is sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import SecretStr

from flywheel.core.llm import LlmClient, LlmSettings


class ScriptedServer:
    """Answers each POST by the next step of ``script``: "500", "slow" or "ok"."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.calls: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls.append(
                    {"path": self.path, "auth": self.headers.get("Authorization", ""), "model": body["model"]}
                )
                step = owner.script.pop(0) if owner.script else "ok"
                if step == "500":
                    self._send(500, {"error": {"message": "upstream exploded"}})
                    return
                if step == "slow":
                    time.sleep(2)
                self._send(
                    200,
                    {
                        "id": "cmpl-1",
                        "object": "chat.completion",
                        "created": 1,
                        "model": "local",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "hello there"},
                            }
                        ],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
                    },
                )

            def _send(self, status: int, payload: dict[str, object]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_base = f"http://127.0.0.1:{self.server.server_port}/v1"


@pytest.fixture
def llm_server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer()
    thread = threading.Thread(target=scripted.server.serve_forever, daemon=True)
    thread.start()
    yield scripted
    scripted.server.shutdown()


def client(server: ScriptedServer, **overrides: object) -> LlmClient:
    settings = LlmSettings(
        model="openai/local", api_base=server.api_base, api_key=SecretStr("sk-test"), timeout_s=5.0, max_retries=2
    )
    return LlmClient(settings.model_copy(update=overrides))


async def test_a_server_error_is_retried_and_the_answer_returned(llm_server):
    llm_server.script = ["500"]
    result = await client(llm_server).complete([{"role": "user", "content": "hi"}])
    assert result.text == "hello there"
    assert (result.input_tokens, result.output_tokens) == (7, 2)
    assert result.latency_ms > 0
    assert len(llm_server.calls) == 2
    assert all(c["auth"] == "Bearer sk-test" and c["path"] == "/v1/chat/completions" for c in llm_server.calls)


async def test_a_hung_server_hits_the_timeout(llm_server):
    llm_server.script = ["slow"]
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out"):
        await client(llm_server, timeout_s=0.3, max_retries=0).complete([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 1.5


async def test_load_litellm_imports_off_the_loop_once_and_configured():
    from flywheel.core import llm

    await llm.load_litellm()
    assert llm._litellm is not None and llm._litellm.telemetry is False
    threads = threading.active_count()
    await llm.load_litellm()  # already loaded: no new thread
    assert threading.active_count() == threads
    assert LlmClient(LlmSettings(model="openai/x"))._litellm is llm._litellm
