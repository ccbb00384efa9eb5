"""The model server as a real process (``python -m flywheel.modelserver --model tiny``):
``POST /v1/completions`` with ``echo``, ``logprobs`` and vLLM's ``prompt_logprobs`` scores the
prompt exactly as a direct transformers forward pass over the same weights; the echoed tokens
are the prompt's; a bad request gets OpenAI's error body. The process is the session's tiny
server (lora_session.py: runtime LoRA loading on, which the base model's answers do not see)."""

from __future__ import annotations

import httpx
import pytest

from flywheel.stack.servers import ModelServer

from .lora_session import lora_session

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMPT = "Run history: temperature 0.7 scored 0.85.\nObserved outcome:\n- temperature 0.65: score 0.840\n"


@pytest.fixture(scope="module")
def tiny_server(servers, session_stack, tmp_path_factory) -> ModelServer:
    """The session's tiny model server (runtime LoRA on, nothing loaded: the base answers)."""
    return lora_session(session_stack, servers, tmp_path_factory).server


def complete(server: ModelServer, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.post(f"{server.url}/completions", json=body, headers=headers, timeout=60)


def test_echoed_logprobs_match_transformers(tiny_server: ModelServer) -> None:
    import torch

    from flywheel.modelserver.loading import TINY_NAME, load_base

    body = {"model": TINY_NAME, "prompt": PROMPT, "echo": True, "logprobs": 1, "prompt_logprobs": 2, "max_tokens": 0}
    resp = complete(tiny_server, body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == PROMPT and "".join(lp["tokens"]) == PROMPT
    assert lp["token_logprobs"][0] is None and choice["prompt_logprobs"][0] is None

    base = load_base("tiny", device="cpu")  # the same seeded weights and tokenizer the server built
    ids = base.tokenizer(PROMPT)["input_ids"]
    assert len(lp["tokens"]) == len(ids) == len(choice["prompt_logprobs"])
    with torch.inference_mode():
        logits = base.model(input_ids=torch.tensor([ids])).logits[0].float()
    direct = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(float(direct.sum()), abs=1e-4)
    vllm = [entry[str(ids[i])]["logprob"] for i, entry in enumerate(choice["prompt_logprobs"]) if entry is not None]
    assert vllm == pytest.approx(direct.tolist(), abs=1e-4)
    assert [lp["text_offset"][i] for i in range(3)] == [0, len(lp["tokens"][0]), len(lp["tokens"][0] + lp["tokens"][1])]


def test_bad_request_gets_an_openai_error(tiny_server: ModelServer) -> None:
    resp = complete(tiny_server, {"model": "tiny-random", "prompt": "hi", "logprobs": 7, "max_tokens": 0})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "logprobs" and "logprobs" in error["message"]
    resp = complete(tiny_server, {"model": "nope", "prompt": "hi", "max_tokens": 0})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    body = {"model": "tiny-random", "prompt": "hi"}
    unauthorised = httpx.post(f"{tiny_server.url}/completions", json=body, timeout=10)
    assert unauthorised.status_code == 401 and "error" in unauthorised.json()
