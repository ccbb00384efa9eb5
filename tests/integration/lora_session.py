"""One runtime-LoRA model server (and one trained adapter) for the session, shared by the model
server tests and the canary tests: each start of the server loads torch and builds the tiny
base (seconds on CI), and the adapter is the same either way. The first test needing one
starts it; ``session_stack`` stops it when the session ends. Tests leave no adapter loaded,
as the exact ``/v1/models`` listings of test_modelserver_lora.py need."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from flywheel.stack.stack import Servers

from .runtime_lora import RuntimeLoraServer, new_bucket, train_adapter


class LoraSession:
    """The shared server, the S3 bucket it may load adapters from, and ``adapter``: trained on
    first use, also under the server's ``lora_root`` as ``support-sft``."""

    def __init__(self, server: RuntimeLoraServer, lora_root: Path, bucket: str, scratch: Path) -> None:
        self.server, self.lora_root, self.bucket = server, lora_root, bucket
        self._scratch = scratch
        self._adapter: Path | None = None

    @property
    def adapter(self) -> Path:
        if self._adapter is None:
            adapter = train_adapter(self._scratch)
            shutil.copytree(adapter, self.lora_root / "support-sft")
            self._adapter = adapter
        return self._adapter


_shared: dict[int, LoraSession] = {}


def lora_session(
    session_stack: contextlib.ExitStack, servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> LoraSession:
    """The session's runtime-LoRA server (``--max-loras 2``; a folder and a bucket allowed),
    started on first use."""
    found = _shared.get(id(session_stack))
    if found is not None:
        return found
    lora_root = tmp_path_factory.mktemp("lora-root")
    bucket = new_bucket(servers.env())
    server = RuntimeLoraServer(
        tmp_path_factory.mktemp("modelserver"), roots=[lora_root], buckets=[bucket], s3_env=servers.env(), max_loras=2
    )
    server.start()
    session_stack.callback(server.stop)
    found = _shared[id(session_stack)] = LoraSession(server, lora_root, bucket, tmp_path_factory.mktemp("trained"))
    return found
