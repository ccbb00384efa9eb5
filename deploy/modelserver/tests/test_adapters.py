"""LoRA adapters served by name beside the base model, in process over HTTP (aiohttp's
test server) with the tiny model: an adapter changes the answers, the base model's stay
the same, and interleaved concurrent requests never see each other's adapter."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flywheel.modelserver.adapters import AdapterSpec
from flywheel.modelserver.app import build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import TINY_NAME, load_base

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    base = load_base("tiny", device="cpu")
    torch.manual_seed(1)
    config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    folder = tmp_path_factory.mktemp("lora")
    get_peft_model(base.model, config).save_pretrained(folder)
    return folder


async def answers(client: TestClient, model: str) -> str:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "model": model})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["choices"][0]["message"]["content"]


async def test_adapters_are_served_by_name_and_switch_safely(adapter_dir: Path) -> None:
    async with TestClient(TestServer(build_app(Engine(load_base("tiny", device="cpu"), {})))) as plain:
        base_answer = await answers(plain, TINY_NAME)

    engine = Engine(load_base("tiny", device="cpu"), {"tuned": adapter_dir})
    async with TestClient(TestServer(build_app(engine))) as client:
        listed = await (await client.get("/v1/models")).json()
        assert [(m["id"], m["parent"]) for m in listed["data"]] == [(TINY_NAME, None), ("tuned", TINY_NAME)]
        tuned_answer = await answers(client, "tuned")
        assert tuned_answer != base_answer
        assert await answers(client, TINY_NAME) == base_answer
        together = await asyncio.gather(*(answers(client, ("tuned", TINY_NAME)[i % 2]) for i in range(6)))
        assert together == [tuned_answer, base_answer] * 3


def test_adapter_specs_are_parsed_with_clear_errors() -> None:
    assert AdapterSpec.parse("tuned=s3://bucket/prefix") == AdapterSpec("tuned", "s3://bucket/prefix")
    with pytest.raises(ValueError, match="expected name=path"):
        AdapterSpec.parse("just-a-path")
    with pytest.raises(ValueError, match="the name must match"):
        AdapterSpec.parse("bad name=/tmp/x")
