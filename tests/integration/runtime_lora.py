"""Shared pieces of the runtime LoRA tests: a model server process with runtime loading on
(the tiny base, the trainer's tiny base too), an adapter trained by the trainer's training
library, and an adapter folder put on S3 as a training job leaves it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minio import Minio

from flywheel.stack.servers import ModelServer

CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Peru", "Lima")]


class RuntimeLoraServer(ModelServer):
    """``python -m flywheel.modelserver --model tiny --allow-runtime-lora`` reading adapters
    from ``roots`` and the S3 ``buckets`` of the stack in ``s3_env``."""

    def __init__(
        self, data_dir: Path, *, roots: list[Path], buckets: list[str], s3_env: Mapping[str, str], max_loras: int = 4
    ) -> None:
        super().__init__(data_dir, model="tiny")
        self.roots, self.buckets, self.s3_env, self.max_loras = roots, buckets, dict(s3_env), max_loras

    def _command(self) -> list[str]:
        extra = ["--allow-runtime-lora", "--max-loras", str(self.max_loras)]
        extra += [f"--lora-root={r}" for r in self.roots] + [f"--lora-bucket={b}" for b in self.buckets]
        return [*super()._command(), *extra]

    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs = super()._popen_kwargs()
        s3 = {k: v for k, v in self.s3_env.items() if k.startswith("FLYWHEEL_S3_")}
        kwargs["env"] = {**kwargs["env"], **s3}
        return kwargs


def train_adapter(out: Path, *, seed: int = 0) -> Path:
    """An SFT adapter of the tiny base from the trainer's training library (two steps at a
    learning rate high enough that its answers differ from the base model's)."""
    from flywheel.trainer.training.run import train
    from flywheel.trainer.training.spec import TrainSpec

    spec = TrainSpec(
        kind="sft",
        base_model="tiny",
        max_steps=2,
        batch_size=2,
        max_length=64,
        learning_rate=0.05,
        seed=seed,
        lora={"r": 4, "alpha": 16},
        device="cpu",
    )
    rows = [
        {"prompt": f"Capital of {country}? Answer with the city alone.\n", "completion": city}
        for country, city in CAPITALS
    ]
    result = train(spec, rows, out)
    return Path(result.adapter_dir)


def s3_client(env: Mapping[str, str]) -> Minio:
    return Minio(
        env["FLYWHEEL_S3_ENDPOINT"],
        access_key=env["FLYWHEEL_S3_ACCESS_KEY"],
        secret_key=env["FLYWHEEL_S3_SECRET_KEY"],
        secure=False,
        region=env.get("FLYWHEEL_S3_REGION", "us-east-1"),
    )


def new_bucket(env: Mapping[str, str]) -> str:
    client = s3_client(env)
    bucket = f"lora-{uuid.uuid4().hex[:10]}"
    client.make_bucket(bucket)
    return bucket


def upload_folder(env: Mapping[str, str], bucket: str, prefix: str, folder: Path) -> str:
    """Put every file under ``folder`` at ``s3://bucket/prefix/...``; returns that URI."""
    client = s3_client(env)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.fput_object(bucket, f"{prefix}/{path.relative_to(folder).as_posix()}", str(path))
    return f"s3://{bucket}/{prefix}"
