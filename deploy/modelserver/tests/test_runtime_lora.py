"""Runtime LoRA loading (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter), in process
over HTTP with the tiny model: a loaded adapter is listed and changes the answers, unloading
it takes it away and leaves the base model as it was; loads are refused when the feature is
off, from outside the allowed places (symbolic links included), under a bad or taken name,
beyond --max-loras, and for an adapter that does not fit the base model, each with an
OpenAI error body naming the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from flywheel.modelserver.adapters import RuntimeLoading
from flywheel.modelserver.app import build_app
from flywheel.modelserver.cli import listener_problem, parse_args
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import TINY_NAME, load_base

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "temperature": 0}


def make_adapter(folder: Path, *, seed: int, targets: list[str]) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    base = load_base("tiny", device="cpu")
    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=64, target_modules=targets, init_lora_weights=False)
    get_peft_model(base.model, config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An allowed root with two adapters, and one that does not fit the tiny model (r on a
    module it lacks is caught by PEFT; here: weights of the wrong shape)."""
    top = tmp_path_factory.mktemp("loras")
    make_adapter(top / "a", seed=1, targets=["q_proj", "v_proj"])
    make_adapter(top / "b", seed=2, targets=["q_proj", "v_proj"])
    broken = make_adapter(top / "broken", seed=3, targets=["q_proj", "v_proj"])
    from safetensors.torch import load_file, save_file

    weights = load_file(broken / "adapter_model.safetensors")
    save_file({k: v[:, :3].contiguous() for k, v in weights.items()}, broken / "adapter_model.safetensors")
    return top


async def answer(client: TestClient, model: str) -> str:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "model": model})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["choices"][0]["message"]["content"]


async def refused(client: TestClient, path: str, body: object, status: int, *words: str) -> dict:
    resp = await client.post(path, json=body)
    got = await resp.json()
    assert resp.status == status, got
    for word in words:
        assert word in got["error"]["message"], got
    return got["error"]


async def models(client: TestClient) -> list[str]:
    return [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]


async def test_load_serve_unload_and_refusals(root: Path, tmp_path: Path) -> None:
    outside = make_adapter(tmp_path / "outside", seed=4, targets=["q_proj", "v_proj"])
    (root / "link").symlink_to(outside, target_is_directory=True)
    runtime = RuntimeLoading(roots=(root,), buckets=frozenset({"adapters"}))
    engine = Engine(load_base("tiny", device="cpu"), {}, max_adapters=2)
    async with TestClient(TestServer(build_app(engine, runtime=runtime, scratch=tmp_path / "scratch"))) as client:
        base_answer = await answer(client, TINY_NAME)
        load = "/v1/load_lora_adapter"

        resp = await client.post(load, json={"lora_name": "tuned-a", "lora_path": str(root / "a")})
        assert resp.status == 200 and "tuned-a" in await resp.text()
        assert await models(client) == [TINY_NAME, "tuned-a"]
        tuned = await answer(client, "tuned-a")
        assert tuned != base_answer
        assert await answer(client, TINY_NAME) == base_answer

        # Refusals, each naming its field; nothing loaded by any of them.
        await refused(client, load, {"lora_name": "x", "lora_path": str(outside)}, 403, "not under an allowed folder")
        await refused(client, load, {"lora_name": "x", "lora_path": str(root / "link")}, 403, "not under an allowed")
        await refused(client, load, {"lora_name": "x", "lora_path": f"{root}/../x"}, 403, "not under an allowed")
        await refused(client, load, {"lora_name": "x", "lora_path": "a"}, 400, "give an absolute folder")
        await refused(client, load, {"lora_name": "x", "lora_path": str(root / "none")}, 404, "no adapter_config")
        await refused(client, load, {"lora_name": "x", "lora_path": "s3://other/p"}, 403, "bucket 'other' is not")
        await refused(client, load, {"lora_name": "x", "lora_path": "s3://adapters/../p"}, 400, "no . or ..")
        await refused(client, load, {"lora_name": "x", "lora_path": "s3://adapters"}, 400, "s3://bucket/prefix")
        await refused(client, load, {"lora_name": "bad name", "lora_path": str(root / "b")}, 400, "lora_name")
        await refused(client, load, {"lora_path": str(root / "b")}, 400, "lora_name: required")
        await refused(client, load, {"lora_name": "x"}, 400, "lora_path: required")
        await refused(client, load, ["not", "an", "object"], 400, "JSON object")
        err = await refused(client, load, {"lora_name": "tuned-a", "lora_path": str(root / "b")}, 400, "already")
        assert err["code"] == "lora_already_loaded"
        await refused(client, load, {"lora_name": TINY_NAME, "lora_path": str(root / "b")}, 400, "already served")
        err = await refused(
            client, load, {"lora_name": "broken", "lora_path": str(root / "broken")}, 400, "could not load"
        )
        assert err["param"] == "lora_path"
        assert await models(client) == [TINY_NAME, "tuned-a"]
        assert await answer(client, "tuned-a") == tuned  # the failed load left the model as it was
        assert await answer(client, TINY_NAME) == base_answer

        resp = await client.post(load, json={"lora_name": "tuned-b", "lora_path": str(root / "b")})
        assert resp.status == 200
        err = await refused(client, load, {"lora_name": "c", "lora_path": str(root / "a")}, 400, "--max-loras")
        assert err["code"] == "too_many_loras"

        unload = "/v1/unload_lora_adapter"
        assert (await client.post(unload, json={"lora_name": "tuned-a"})).status == 200
        assert await models(client) == [TINY_NAME, "tuned-b"]
        await refused(client, "/v1/chat/completions", {**CHAT, "model": "tuned-a"}, 404, "not served")
        await refused(client, unload, {"lora_name": "tuned-a"}, 404, "is not loaded")
        assert (await client.post(unload, json={"lora_name": "tuned-b"})).status == 200
        assert await models(client) == [TINY_NAME]
        assert await answer(client, TINY_NAME) == base_answer  # the last unload restored the plain model

        # Loaded again after everything was unloaded: the same answers as the first time.
        resp = await client.post(load, json={"lora_name": "tuned-a", "lora_path": str(root / "a")})
        assert resp.status == 200
        assert await answer(client, "tuned-a") == tuned


async def test_runtime_loading_off_and_api_key(root: Path) -> None:
    base = load_base("tiny", device="cpu")
    async with TestClient(TestServer(build_app(Engine(base, {})))) as client:
        await refused(client, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(root / "a")}, 404, "is off")
    runtime = RuntimeLoading(roots=(root,))
    app = build_app(Engine(base, {}), api_key="sk-1", runtime=runtime)  # an app closes its engine
    async with TestClient(TestServer(app)) as client:
        body = {"lora_name": "a", "lora_path": str(root / "a")}
        await refused(client, "/v1/load_lora_adapter", body, 401, "API key")
        resp = await client.post("/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer sk-1"})
        assert resp.status == 200


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--allow-runtime-lora"], {}, "--lora-root and/or --lora-bucket"),
        (["--allow-runtime-lora", "--lora-bucket", "b", "--host", "0.0.0.0", "--allow-insecure"], {}, "API_KEY"),
        (["--allow-runtime-lora", "--lora-bucket", "b", "--max-loras", "0"], {}, "--max-loras 0"),
        (["--allow-runtime-lora", "--lora-bucket", "b", "--host", "0.0.0.0"], {"key": "k"}, None),
        (["--lora-root", "/x"], {}, None),
    ],
)
def test_runtime_lora_start_up_rules(argv: list[str], env: dict[str, str], says: str | None) -> None:
    args: argparse.Namespace = parse_args(argv)
    problem = listener_problem(args, env.get("key"))
    assert problem is None if says is None else says in (problem or "")


def test_flags_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_MODELSERVER_ALLOW_RUNTIME_LORA", "true")
    monkeypatch.setenv("FLYWHEEL_MODELSERVER_LORA_BUCKETS", "one,two")
    monkeypatch.setenv("FLYWHEEL_MODELSERVER_LORA_ROOTS", "/a:/b")
    monkeypatch.setenv("FLYWHEEL_MODELSERVER_MAX_LORAS", "3")
    args = parse_args([])
    assert (args.allow_runtime_lora, args.lora_bucket, args.lora_root, args.max_loras) == (
        True,
        ["one", "two"],
        [Path("/a"), Path("/b")],
        3,
    )
