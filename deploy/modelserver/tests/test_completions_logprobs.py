"""``POST /v1/completions`` in process over HTTP with the tiny model: echoed prompt tokens and
their log-probabilities (OpenAI's shape) and vLLM's ``prompt_logprobs`` agree with a direct
forward pass through the same weights, with and without a LoRA adapter named by ``model``;
``max_tokens: 0`` only scores; generated tokens are scored too; bad requests get an OpenAI
error body naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flywheel.modelserver.app import build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import TINY_NAME, load_base

PROMPT = "Context: the run tried temperature 0.7.\nOutcome: score=0.85 — naïve café ✓"


def direct_logprobs(model, ids: list[int]) -> list[float]:
    """log p(token i | tokens before it) for i >= 1, straight from transformers."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    folder = tmp_path_factory.mktemp("lora") / "a"
    base = load_base("tiny", device="cpu")
    torch.manual_seed(7)
    config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base.model, config).save_pretrained(folder)
    return folder


@pytest.fixture
async def client(adapter: Path):
    engine = Engine(load_base("tiny", device="cpu"), {"tuned": adapter}, max_tokens_cap=32)
    async with TestClient(TestServer(build_app(engine))) as c:
        c.engine = engine  # type: ignore[attr-defined]
        yield c


async def post(client: TestClient, body: dict, status: int = 200) -> dict:
    resp = await client.post("/v1/completions", json=body)
    got = await resp.json()
    assert resp.status == status, got
    return got


async def test_echo_scores_the_prompt_as_transformers_does(client: TestClient) -> None:
    body = {"model": TINY_NAME, "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 0, "prompt_logprobs": 3}
    got = await post(client, body)
    choice = got["choices"][0]
    assert got["object"] == "text_completion" and choice["text"] == PROMPT
    lp = choice["logprobs"]
    ids = client.engine.tokenizer(PROMPT)["input_ids"]  # type: ignore[attr-defined]
    assert len(lp["tokens"]) == len(ids) == got["usage"]["prompt_tokens"] and got["usage"]["completion_tokens"] == 0
    assert "".join(lp["tokens"]) == PROMPT
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    direct = direct_logprobs(load_base("tiny", device="cpu").model, ids)
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(sum(direct), abs=1e-4)
    assert lp["token_logprobs"][1:] == pytest.approx(direct, abs=1e-4)
    assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"][1:])

    # vLLM's prompt_logprobs: aligned with the prompt tokens, the token itself plus the top 3.
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for i, entry in enumerate(plp[1:], start=1):
        mine = entry[str(ids[i])]
        assert mine["logprob"] == pytest.approx(lp["token_logprobs"][i], abs=1e-6) and mine["rank"] >= 1
        assert 3 <= len(entry) <= 4
        best = min(entry.values(), key=lambda e: e["rank"])
        assert best["rank"] == 1 and best["logprob"] >= mine["logprob"] and isinstance(best["decoded_token"], str)


async def test_the_adapter_named_by_model_is_applied(client: TestClient, adapter: Path) -> None:
    from peft import PeftModel

    body = {"prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 0}
    base = (await post(client, {**body, "model": TINY_NAME}))["choices"][0]["logprobs"]["token_logprobs"][1:]
    tuned = (await post(client, {**body, "model": "tuned"}))["choices"][0]["logprobs"]["token_logprobs"][1:]
    ids = client.engine.tokenizer(PROMPT)["input_ids"]  # type: ignore[attr-defined]
    direct = direct_logprobs(PeftModel.from_pretrained(load_base("tiny", device="cpu").model, adapter).eval(), ids)
    assert tuned == pytest.approx(direct, abs=1e-4)
    assert abs(sum(tuned) - sum(base)) > 1e-3
    again = (await post(client, {**body, "model": TINY_NAME}))["choices"][0]["logprobs"]["token_logprobs"][1:]
    assert again == pytest.approx(base, abs=1e-6)


async def test_generated_tokens_are_scored(client: TestClient) -> None:
    got = await post(client, {"model": TINY_NAME, "prompt": "hello", "max_tokens": 6, "temperature": 0, "logprobs": 1})
    choice = got["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == got["usage"]["completion_tokens"] <= 6
    assert "".join(lp["tokens"]) == choice["text"] and lp["text_offset"][0] == 0
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"])
    echoed = await post(
        client, {"model": TINY_NAME, "prompt": "hello", "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 1}
    )
    assert echoed["choices"][0]["text"] == "hello" + choice["text"]
    assert echoed["choices"][0]["logprobs"]["token_logprobs"][-len(lp["tokens"]) :] == pytest.approx(
        lp["token_logprobs"], abs=1e-5
    )


async def test_token_id_prompt_and_plain_completion(client: TestClient) -> None:
    ids = client.engine.tokenizer("one two three")["input_ids"]  # type: ignore[attr-defined]
    got = await post(client, {"model": TINY_NAME, "prompt": ids, "echo": True, "logprobs": 0, "max_tokens": 0})
    assert got["choices"][0]["text"] == "one two three" and got["usage"]["prompt_tokens"] == len(ids)
    assert "".join(got["choices"][0]["logprobs"]["tokens"]) == "one two three"
    plain = await post(client, {"model": TINY_NAME, "prompt": ["hi"], "max_tokens": 3, "temperature": 0})
    assert plain["choices"][0]["logprobs"] is None and "prompt_logprobs" not in plain["choices"][0]


BAD = [
    ({"stream": True}, 400, "stream", "streaming"),
    ({"logprobs": 9}, 400, "logprobs", "logprobs"),
    ({"prompt_logprobs": 21}, 400, "prompt_logprobs", "prompt_logprobs"),
    ({"n": 2}, 400, "n", "n=1"),
    ({"prompt": ""}, 400, "prompt", "empty"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "one prompt"),
    ({"prompt": [1, 10**9]}, 400, "prompt", "vocabulary"),
    ({"max_tokens": -1}, 400, "max_tokens", "max_tokens"),
    ({"max_tokens": 33}, 400, "max_tokens", "cap 32"),
    ({"model": "nope"}, 404, "model", "not served"),
    ({"suffix": "x"}, 400, "suffix", "suffix"),
]


async def test_bad_requests_get_openai_errors(client: TestClient) -> None:
    for change, status, param, words in BAD:
        body = {"model": TINY_NAME, "prompt": "hello", "max_tokens": 0, **change}
        err = (await post(client, body, status))["error"]
        assert err["param"] == param and words in err["message"], (change, err)
        assert err["type"] in {"invalid_request_error", "not_found_error"}
    resp = await client.post("/v1/completions", data=b"[1,2", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
