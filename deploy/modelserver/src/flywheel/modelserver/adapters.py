"""LoRA adapters (PEFT) served under their own model names, from a folder or an S3 prefix.

An S3 prefix (``s3://bucket/prefix``) is downloaded once into the cache directory with
the credentials of the local stack's variables (``FLYWHEEL_S3_ENDPOINT``,
``FLYWHEEL_S3_ACCESS_KEY``, ``FLYWHEEL_S3_SECRET_KEY``, ``FLYWHEEL_S3_SECURE``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter to serve: the model name clients use and where its files are."""

    name: str
    location: str

    @classmethod
    def parse(cls, text: str) -> AdapterSpec:
        """Parse ``name=path`` (``--adapter`` on the command line)."""
        name, sep, location = text.partition("=")
        if not sep or not location:
            raise ValueError(f"--adapter {text!r}: expected name=path (a folder or s3://bucket/prefix)")
        if not NAME.fullmatch(name):
            raise ValueError(f"--adapter {text!r}: the name must match {NAME.pattern}")
        return cls(name, location)


def local_folder(spec: AdapterSpec, cache_dir: Path) -> Path:
    """A local folder holding the adapter's files (downloading an S3 prefix first)."""
    if not spec.location.startswith("s3://"):
        folder = Path(spec.location)
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter {spec.name}: no adapter_config.json in {folder}")
        return folder
    bucket, _, prefix = spec.location[len("s3://") :].partition("/")
    target = cache_dir / "adapters" / bucket / prefix.strip("/")
    _download_prefix(bucket, prefix.strip("/"), target)
    if not (target / "adapter_config.json").is_file():
        raise FileNotFoundError(f"adapter {spec.name}: no adapter_config.json under {spec.location}")
    return target


def _download_prefix(bucket: str, prefix: str, target: Path) -> None:
    from minio import Minio

    endpoint = os.environ.get("FLYWHEEL_S3_ENDPOINT")
    if not endpoint:
        raise RuntimeError("FLYWHEEL_S3_ENDPOINT (and _ACCESS_KEY, _SECRET_KEY) must be set to load adapters from S3")
    client = Minio(
        endpoint,
        access_key=os.environ.get("FLYWHEEL_S3_ACCESS_KEY"),
        secret_key=os.environ.get("FLYWHEEL_S3_SECRET_KEY"),
        secure=os.environ.get("FLYWHEEL_S3_SECURE", "false").lower() in ("1", "true", "yes"),
        region=os.environ.get("FLYWHEEL_S3_REGION", "us-east-1"),
    )
    for obj in client.list_objects(bucket, prefix=f"{prefix}/" if prefix else "", recursive=True):
        name = obj.object_name or ""
        relative = name[len(prefix) :].lstrip("/")
        if not relative or ".." in Path(relative).parts:
            continue
        dest = target / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.fget_object(bucket, name, str(dest))
