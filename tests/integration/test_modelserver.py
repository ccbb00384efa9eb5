"""The local model server as a real process, called the way products call models: through
LiteLLM's OpenAI provider with an api_base, plain and streamed, plus its error answers."""

from __future__ import annotations

import json

import httpx
import litellm
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_model(model_server) -> str:
    listed = httpx.get(f"{model_server.url}/models", headers=auth(model_server), timeout=10).json()
    assert listed["object"] == "list" and listed["data"][0]["object"] == "model"
    return listed["data"][0]["id"]


def auth(model_server) -> dict[str, str]:
    return {"Authorization": f"Bearer {model_server.api_key}"}


QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


async def test_litellm_chat_completion_with_usage(model_server, base_model):
    resp = await litellm.acompletion(
        model=f"openai/{base_model}",
        api_base=model_server.url,
        api_key=model_server.api_key,
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
    )
    text = resp.choices[0].message.content
    assert text.strip()
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens > 5 and 0 < resp.usage.completion_tokens <= 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    if base_model == "smollm2-135m-instruct":  # the real model knows this one
        assert "paris" in text.lower()


async def test_litellm_streaming_gives_the_same_answer_in_pieces(model_server, base_model):
    kwargs = {
        "model": f"openai/{base_model}",
        "api_base": model_server.url,
        "api_key": model_server.api_key,
        "messages": QUESTION,
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = (await litellm.acompletion(**kwargs)).choices[0].message.content
    stream = await litellm.acompletion(**kwargs, stream=True)
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) >= 2
    assert "".join(pieces) == whole


def test_raw_sse_stream_ends_with_usage_and_done(model_server, base_model):
    body = {
        "model": base_model,
        "messages": QUESTION,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{model_server.url}/chat/completions", json=body, headers=auth(model_server), timeout=60
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] <= 4 and usage["prompt_tokens"] > 5


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"messages": QUESTION}, 400, "model: Field required"),
        ({"model": "{base}", "messages": []}, 400, "messages: List should have at least 1 item"),
        ({"model": "{base}", "messages": QUESTION, "temperature": 7}, 400, "temperature: Input should be less"),
        ({"model": "{base}", "messages": QUESTION, "n": 2}, 400, "only n=1 is supported"),
        ({"model": "{base}", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
        ({"model": "{base}", "messages": QUESTION, "max_tokens": 10**6}, 400, "max_tokens 1000000 is more than"),
        ({"model": "no-such-model", "messages": QUESTION}, 404, "served models: {base}"),
        ("not json", 400, "not valid JSON"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_message(model_server, base_model, body, status, says):
    if isinstance(body, dict):
        body = {k: (v.format(base=base_model) if isinstance(v, str) else v) for k, v in body.items()}
        resp = httpx.post(f"{model_server.url}/chat/completions", json=body, headers=auth(model_server), timeout=30)
    else:
        resp = httpx.post(f"{model_server.url}/chat/completions", content=body, headers=auth(model_server), timeout=30)
    assert resp.status_code == status
    assert says.format(base=base_model) in resp.json()["error"]["message"]


def test_a_wrong_api_key_is_refused(model_server, base_model):
    body = {"model": base_model, "messages": QUESTION, "max_tokens": 2}
    resp = httpx.post(f"{model_server.url}/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401 and "API key" in resp.json()["error"]["message"]
