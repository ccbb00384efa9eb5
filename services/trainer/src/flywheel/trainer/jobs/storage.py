"""Folders to and from S3: checkpoints and adapters up, checkpoints and base models down.

Synchronous (minio's client is): the runner calls these from the training thread, so a
checkpoint is in S3 before training goes on, or through ``asyncio.to_thread``."""

from __future__ import annotations

from pathlib import Path

from minio import Minio

CHECKPOINTS = "checkpoints"  # object-store purpose (bucket <prefix>-checkpoints)
# Weight files, left out where only a model's config and tokenizer are wanted (a dry run).
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (bucket, "some/prefix")."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket")
    return bucket, key.strip("/")


def upload_dir(client: Minio, bucket: str, prefix: str, folder: Path) -> str:
    """Upload every file under ``folder`` to ``bucket/prefix/...``; returns the s3:// prefix.
    A marker object ``_COMPLETE`` goes last, so a reader never takes a half-uploaded folder."""
    prefix = prefix.strip("/")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.fput_object(bucket, f"{prefix}/{path.relative_to(folder).as_posix()}", str(path))
    client.put_object(bucket, f"{prefix}/_COMPLETE", _empty(), 0)
    return f"s3://{bucket}/{prefix}"


def is_complete(client: Minio, uri: str) -> bool:
    bucket, prefix = split_uri(uri)
    try:
        client.stat_object(bucket, f"{prefix}/_COMPLETE")
    except Exception:  # noqa: BLE001 - missing marker, or no such bucket: not complete
        return False
    return True


def download_prefix(client: Minio, uri: str, target: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """Download ``s3://bucket/prefix`` into ``target`` (skipping files already there with the
    same size: a base model is fetched once per trainer). Refuses keys that climb out."""
    bucket, prefix = split_uri(uri)
    found = False
    for obj in client.list_objects(bucket, prefix=f"{prefix}/" if prefix else "", recursive=True):
        name = obj.object_name or ""
        relative = name[len(prefix) :].lstrip("/")
        if not relative or relative == "_COMPLETE" or relative.endswith(skip):
            continue
        if ".." in Path(relative).parts or Path(relative).is_absolute():
            raise ValueError(f"{uri}: object {name!r} would be written outside the target folder")
        found = True
        dest = target / relative
        if dest.is_file() and obj.size is not None and dest.stat().st_size == obj.size:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.fget_object(bucket, name, str(dest))
    if not found:
        raise FileNotFoundError(f"{uri}: no objects under this prefix")
    return target


def _empty():  # type: ignore[no-untyped-def]
    import io

    return io.BytesIO(b"")
