"""``response_format`` over HTTP with the tiny random model: whatever gibberish it would write,
the answer is JSON that follows the schema (chat, streamed chat and legacy completions,
greedy and sampled); ``json_object`` gives an object; a schema the server cannot enforce, or a
malformed ``response_format``, is a 400 naming the field; requests without one never build
the grammar machinery."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flywheel.modelserver.app import build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import TINY_NAME, load_base

SCHEMA = {
    "type": "object",
    "properties": {
        "thought": {"type": "string", "minLength": 1, "maxLength": 12},
        "params": {
            "type": "object",
            "properties": {
                "optimizer": {"enum": ["adam", "sgd"]},
                "layers": {"type": "integer", "minimum": 1, "maximum": 8},
                "lr": {"type": "number", "minimum": 0.001, "maximum": 0.1, "multipleOf": 0.001},
            },
            "required": ["optimizer", "layers", "lr"],
            "additionalProperties": False,
        },
        "ok": {"type": "boolean"},
    },
    "required": ["thought", "params", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "proposal", "schema": SCHEMA, "strict": True}}
EMPTY_RANGE = {"type": "integer", "minimum": 5, "maximum": 1}
MESSAGES = [{"role": "user", "content": "Propose a config."}]


def assert_follows_schema(text: str) -> None:
    data = json.loads(text)
    assert set(data) == {"thought", "params", "ok"}, data
    assert isinstance(data["thought"], str) and 1 <= len(data["thought"]) <= 12
    assert isinstance(data["ok"], bool)
    params = data["params"]
    assert set(params) == {"optimizer", "layers", "lr"}, params
    assert params["optimizer"] in ("adam", "sgd")
    assert isinstance(params["layers"], int) and not isinstance(params["layers"], bool)
    assert 1 <= params["layers"] <= 8
    assert 0.001 <= params["lr"] <= 0.1
    assert round(params["lr"] * 1000) == pytest.approx(params["lr"] * 1000)


@pytest.fixture(scope="module")
def base():
    return load_base("tiny", device="cpu")


@pytest.fixture
async def client(base):
    engine = Engine(base, {}, max_tokens_cap=256)
    async with TestClient(TestServer(build_app(engine))) as c:
        c.engine = engine  # type: ignore[attr-defined]
        yield c


async def chat(client: TestClient, status: int = 200, **fields) -> dict:
    body = {"model": TINY_NAME, "messages": MESSAGES, "max_tokens": 200, **fields}
    resp = await client.post("/v1/chat/completions", json=body)
    got = await resp.json()
    assert resp.status == status, got
    return got


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (1.5, 0.5)])
async def test_chat_answer_follows_the_schema(client: TestClient, temperature: float, top_p: float) -> None:
    got = await chat(client, response_format=FORMAT, temperature=temperature, top_p=top_p, seed=3)
    choice = got["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert_follows_schema(choice["message"]["content"])


async def test_the_tiny_model_writes_no_json_unconstrained(client: TestClient) -> None:
    # What the constraint is for: the same request without it is not JSON.
    got = await chat(client, temperature=0.0, max_tokens=40)
    with pytest.raises(json.JSONDecodeError):
        json.loads(got["choices"][0]["message"]["content"])
    assert client.engine.grammars._lltokenizer is None  # type: ignore[attr-defined]  # nothing built for it


async def test_streamed_answer_follows_the_schema(client: TestClient) -> None:
    body = {"model": TINY_NAME, "messages": MESSAGES, "max_tokens": 200, "stream": True, "response_format": FORMAT}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    text, finish = "", None
    for line in (await resp.text()).splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content", "")
            finish = choice["finish_reason"] or finish
    assert finish == "stop"
    assert_follows_schema(text)


async def test_json_object_gives_an_object(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "additionalProperties": False}
    got = await chat(client, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert got["choices"][0]["message"]["content"] == '{"a":1}'
    # Any object: the random model may not close it within max_tokens, so what it wrote is a
    # prefix of an object when cut, and an object when it stopped.
    for seed in range(2):
        got = await chat(client, response_format={"type": "json_object"}, seed=seed, max_tokens=48)
        choice = got["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{")
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)


async def test_legacy_completions_follow_the_schema(client: TestClient) -> None:
    body = {"model": TINY_NAME, "prompt": "Config:", "max_tokens": 200, "temperature": 0.8, "response_format": FORMAT}
    resp = await client.post("/v1/completions", json=body)
    got = await resp.json()
    assert resp.status == 200, got
    assert got["choices"][0]["finish_reason"] == "stop"
    assert_follows_schema(got["choices"][0]["text"])


async def test_text_format_is_unconstrained(client: TestClient) -> None:
    plain = await chat(client, temperature=0.0, max_tokens=20)
    text = await chat(client, temperature=0.0, max_tokens=20, response_format={"type": "text"})
    assert text["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}},
         "response_format.json_schema.schema", "not"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
         "response_format.json_schema.schema", "strin"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": EMPTY_RANGE}},
         "response_format.json_schema.schema", "schema"),
        ({"type": "json_schema"}, "response_format", "json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name", "name"),
        ({"type": "xml"}, "response_format.type", "type"),
    ],
)  # fmt: skip
async def test_bad_response_format_is_a_400_naming_the_field(
    client: TestClient, response_format: dict, param: str, words: str
) -> None:
    got = await chat(client, status=400, response_format=response_format)
    error = got["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert param in error["message"] and words in error["message"], error
