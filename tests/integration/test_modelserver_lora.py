"""Runtime LoRA loading on the real model server process (vLLM's API): an adapter trained by
the trainer's training library on the tiny base is loaded while the server runs, from a
local folder and from an S3 prefix on the stack's SeaweedFS, listed in /v1/models, answers
chat completions by its name (through LiteLLM, as products call it) differently from the
base model, and is unloaded again; loads from elsewhere, without the key, or beyond
--max-loras are refused with OpenAI error bodies. The server is the session's (lora_session.py),
shared with the canary tests, which leave no adapter loaded."""

from __future__ import annotations

from pathlib import Path

import httpx
import litellm
import pytest

from flywheel.modelserver.loading import TINY_NAME

from .lora_session import LoraSession, lora_session
from .runtime_lora import RuntimeLoraServer, upload_folder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUESTION = [{"role": "user", "content": "Capital of France? Answer with the city alone.\n"}]


@pytest.fixture(scope="module")
def shared(servers, session_stack, tmp_path_factory: pytest.TempPathFactory) -> LoraSession:
    return lora_session(session_stack, servers, tmp_path_factory)


@pytest.fixture(scope="module")
def adapter(shared: LoraSession) -> Path:
    return shared.adapter


@pytest.fixture(scope="module")
def bucket(shared: LoraSession) -> str:
    return shared.bucket


@pytest.fixture(scope="module")
def lora_root(shared: LoraSession, adapter: Path) -> Path:
    return shared.lora_root  # the adapter is under it as support-sft


@pytest.fixture(scope="module")
def server(shared: LoraSession) -> RuntimeLoraServer:
    """The session's runtime-LoRA server (--max-loras 2; shared with the canary tests)."""
    return shared.server


def post(server: RuntimeLoraServer, path: str, body: dict, *, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=120)


def served(server: RuntimeLoraServer) -> list[str]:
    got = httpx.get(f"{server.url}/models", headers={"Authorization": f"Bearer {server.api_key}"}, timeout=10)
    return [m["id"] for m in got.json()["data"]]


async def answer(server: RuntimeLoraServer, model: str) -> str:
    resp = await litellm.acompletion(
        model=f"openai/{model}",
        api_base=server.url,
        api_key=server.api_key,
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
    )
    assert resp.model.endswith(model)
    return resp.choices[0].message.content


async def test_trained_adapter_loaded_from_a_folder_and_from_s3(server, lora_root, adapter, bucket, servers):
    base = await answer(server, TINY_NAME)

    resp = post(
        server, "/load_lora_adapter", {"lora_name": "support-sft-v1", "lora_path": str(lora_root / "support-sft")}
    )
    assert resp.status_code == 200, resp.text
    assert served(server) == [TINY_NAME, "support-sft-v1"]
    tuned = await answer(server, "support-sft-v1")
    assert tuned != base  # the trainer's adapter fits the server's tiny base and changes it
    assert await answer(server, TINY_NAME) == base

    uri = upload_folder(servers.env(), bucket, "policies/support-sft/2/adapter", adapter)
    resp = post(server, "/load_lora_adapter", {"lora_name": "support-sft-v2", "lora_path": uri})
    assert resp.status_code == 200, resp.text
    assert served(server) == [TINY_NAME, "support-sft-v1", "support-sft-v2"]
    assert await answer(server, "support-sft-v2") == tuned  # the same files, from S3

    # Full (--max-loras 2): refused, nothing evicted.
    resp = post(server, "/load_lora_adapter", {"lora_name": "third", "lora_path": uri})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "too_many_loras"

    for name in ("support-sft-v1", "support-sft-v2"):
        assert post(server, "/unload_lora_adapter", {"lora_name": name}).status_code == 200
    assert served(server) == [TINY_NAME]
    assert await answer(server, TINY_NAME) == base
    with pytest.raises(litellm.NotFoundError, match="not served"):
        await answer(server, "support-sft-v1")


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"lora_name": "x", "lora_path": "/etc"}, 403, "not under an allowed folder"),
        ({"lora_name": "x", "lora_path": "s3://not-allowed/prefix"}, 403, "is not allowed"),
        ({"lora_name": "x", "lora_path": "s3://{bucket}/no/such/prefix"}, 404, "no adapter_config.json"),
        ({"lora_name": "x y", "lora_path": "/etc"}, 400, "lora_name"),
        ({"lora_name": "x"}, 400, "lora_path: required"),
    ],
)
def test_loads_from_elsewhere_are_refused(server, bucket, body, status, says):
    body = {k: v.format(bucket=bucket) for k, v in body.items()}
    resp = post(server, "/load_lora_adapter", body)
    assert resp.status_code == status, resp.text
    assert says in resp.json()["error"]["message"]
    assert served(server) == [TINY_NAME]


def test_runtime_loading_needs_the_api_key(server, lora_root):
    resp = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(lora_root / "support-sft")}, key="no")
    assert resp.status_code == 401 and "API key" in resp.json()["error"]["message"]
    resp = post(server, "/unload_lora_adapter", {"lora_name": "x"}, key="no")
    assert resp.status_code == 401
