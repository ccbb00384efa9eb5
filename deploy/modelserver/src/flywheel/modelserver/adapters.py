"""LoRA adapters (PEFT) served under their own model names, from a folder or an S3 prefix.

An S3 prefix (``s3://bucket/prefix``) is downloaded once into the cache directory with
the credentials of the local stack's variables (``FLYWHEEL_S3_ENDPOINT``,
``FLYWHEEL_S3_ACCESS_KEY``, ``FLYWHEEL_S3_SECRET_KEY``, ``FLYWHEEL_S3_SECURE``).

Adapters loaded while the server runs (``POST /v1/load_lora_adapter``) come only from where
the operator allowed (``RuntimeLoading``): an ``s3://`` prefix in a listed bucket, or a folder
under a listed local root (symbolic links resolved first), never any other path."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.modelserver.protocol import RequestError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
MAX_ADAPTER_BYTES = 2 * 1024**3  # a LoRA adapter of a small model is megabytes; refuse anything huge


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


@dataclass(frozen=True)
class RuntimeLoading:
    """Where adapters loaded at run time may come from (``--lora-root``, ``--lora-bucket``)."""

    roots: tuple[Path, ...] = ()
    buckets: frozenset[str] = field(default_factory=frozenset)
    max_bytes: int = MAX_ADAPTER_BYTES

    def __post_init__(self) -> None:
        # Compared with resolved folders, so resolved too.
        object.__setattr__(self, "roots", tuple(Path(r).resolve() for r in self.roots))
        object.__setattr__(self, "buckets", frozenset(self.buckets))

    def check_name(self, name: object) -> str:
        """The adapter's served name, or RequestError naming ``lora_name``."""
        if not isinstance(name, str) or not name:
            raise RequestError("lora_name: required, a non-empty string", param="lora_name")
        if not NAME.fullmatch(name):
            raise RequestError(f"lora_name {name[:80]!r}: must match {NAME.pattern}", param="lora_name")
        return name

    def check_location(self, path: object) -> str:
        """``lora_path`` as it will be read (an ``s3://bucket/prefix`` or a resolved absolute
        folder), or RequestError saying which places are allowed."""
        if not isinstance(path, str) or not path:
            raise RequestError("lora_path: required, a non-empty string", param="lora_path")
        if "\x00" in path or len(path) > 1024:
            raise RequestError("lora_path: has a NUL character or is over 1024 characters", param="lora_path")
        if path.startswith("s3://"):
            return self._check_s3(path)
        return str(self._check_folder(path))

    def allowed(self) -> str:
        places = [f"s3://{b}/..." for b in sorted(self.buckets)] + [f"{r}/..." for r in self.roots]
        return ", ".join(places) if places else "nowhere (start the server with --lora-root or --lora-bucket)"

    def _check_s3(self, path: str) -> str:
        bucket, _, prefix = path[len("s3://") :].partition("/")
        parts = [p for p in prefix.split("/") if p]
        if not BUCKET.fullmatch(bucket) or not parts or any(p in (".", "..") for p in parts):
            raise RequestError(f"lora_path {path!r}: expected s3://bucket/prefix (no . or .. parts)", param="lora_path")
        if bucket not in self.buckets:
            raise RequestError(
                f"lora_path {path!r}: bucket {bucket!r} is not allowed; allowed: {self.allowed()}",
                status=403,
                param="lora_path",
            )
        return f"s3://{bucket}/{'/'.join(parts)}"

    def _check_folder(self, path: str) -> Path:
        given = Path(path)
        if not given.is_absolute():
            raise RequestError(f"lora_path {path!r}: give an absolute folder or s3://bucket/prefix", param="lora_path")
        folder = given.resolve()  # symbolic links followed before the check, so none leads out
        if not any(folder.is_relative_to(root) for root in self.roots):
            raise RequestError(
                f"lora_path {path!r}: not under an allowed folder; allowed: {self.allowed()}",
                status=403,
                param="lora_path",
            )
        if not (folder / "adapter_config.json").is_file():
            raise RequestError(
                f"lora_path {path!r}: no adapter_config.json there",
                status=404,
                param="lora_path",
                code="lora_not_found",
            )
        return folder

    def fetch(self, location: str, scratch: Path) -> Path:
        """The local folder of a checked location: an S3 prefix is downloaded into ``scratch``
        (blocking: call it off the event loop)."""
        if not location.startswith("s3://"):
            return Path(location)
        bucket, _, prefix = location[len("s3://") :].partition("/")
        try:
            _download_prefix(bucket, prefix, scratch, max_bytes=self.max_bytes)
        except RequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - S3's errors vary; the client needs the message
            raise RequestError(f"lora_path {location!r}: could not read it: {exc}", param="lora_path") from None
        if not (scratch / "adapter_config.json").is_file():
            raise RequestError(
                f"lora_path {location!r}: no adapter_config.json under that prefix",
                status=404,
                param="lora_path",
                code="lora_not_found",
            )
        return scratch


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


def _download_prefix(bucket: str, prefix: str, target: Path, *, max_bytes: int | None = None) -> None:
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
    objects = list(client.list_objects(bucket, prefix=f"{prefix}/" if prefix else "", recursive=True))
    total = sum(obj.size or 0 for obj in objects)
    if max_bytes is not None and total > max_bytes:
        raise RequestError(
            f"lora_path s3://{bucket}/{prefix}: {total} bytes, more than the {max_bytes} an adapter may have",
            param="lora_path",
        )
    for obj in objects:
        name = obj.object_name or ""
        relative = name[len(prefix) :].lstrip("/")
        if not relative or ".." in Path(relative).parts:
            continue
        dest = target / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.fget_object(bucket, name, str(dest))
