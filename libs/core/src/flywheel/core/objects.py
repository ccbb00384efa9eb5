"""Object storage (S3, MinIO, SeaweedFS) through the ``minio`` client.

Buckets are named ``<bucket_prefix>-<purpose>`` (traces, datasets, checkpoints,
reports); ``get_object`` reads by bucket name, for URIs another service wrote. minio is
synchronous, so calls run in a worker thread."""

from __future__ import annotations

import asyncio
import io
from datetime import timedelta

import urllib3
from minio import Minio
from minio.error import S3Error

from flywheel.core.settings import S3Settings


class ObjectStore:
    """A thin async facade over one S3 endpoint."""

    def __init__(self, settings: S3Settings) -> None:
        self._prefix = settings.bucket_prefix
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=2.0, read=30.0),
            retries=urllib3.Retry(total=2, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
            maxsize=16,
            cert_reqs="CERT_REQUIRED" if settings.cert_check else "CERT_NONE",
            ca_certs=str(settings.ca_file) if settings.ca_file else None,
        )
        self.client = Minio(
            settings.endpoint,
            access_key=settings.access_key,
            secret_key=settings.secret_key.get_secret_value(),
            secure=settings.secure,
            region=settings.region,
            http_client=http,
        )

    def bucket(self, purpose: str) -> str:
        return f"{self._prefix}-{purpose}"

    async def ensure_bucket(self, purpose: str) -> str:
        name = self.bucket(purpose)

        def _ensure() -> None:
            if not self.client.bucket_exists(name):
                self.client.make_bucket(name)

        await asyncio.to_thread(_ensure)
        return name

    async def put_bytes(
        self, purpose: str, key: str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> str:
        """Store an object and return its ``s3://bucket/key`` URI."""
        bucket = self.bucket(purpose)
        await asyncio.to_thread(
            self.client.put_object, bucket, key, io.BytesIO(data), len(data), content_type=content_type
        )
        return f"s3://{bucket}/{key}"

    async def get_bytes(self, purpose: str, key: str) -> bytes:
        def _get() -> bytes:
            resp = self.client.get_object(self.bucket(purpose), key)
            try:
                return resp.read()
            finally:
                resp.close()
                resp.release_conn()

        return await asyncio.to_thread(_get)

    async def get_object(self, bucket: str, key: str, *, max_bytes: int | None = None) -> bytes:
        """Read ``s3://bucket/key`` by bucket *name*, for objects another service named in a
        URI (a dataset manifest and its files) rather than by purpose. FileNotFoundError when
        the bucket or key does not exist; ValueError when the object is over ``max_bytes``
        (read no further than that)."""

        def _get() -> bytes:
            try:
                resp = self.client.get_object(bucket, key)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket"):
                    raise FileNotFoundError(f"s3://{bucket}/{key}: {exc.code}") from exc
                raise
            try:
                data = resp.read() if max_bytes is None else resp.read(max_bytes + 1)
            finally:
                resp.close()
                resp.release_conn()
            if max_bytes is not None and len(data) > max_bytes:
                raise ValueError(f"s3://{bucket}/{key}: larger than the {max_bytes}-byte limit")
            return data

        return await asyncio.to_thread(_get)

    async def list_keys(self, purpose: str, prefix: str = "") -> list[str]:
        def _list() -> list[str]:
            objs = self.client.list_objects(self.bucket(purpose), prefix=prefix, recursive=True)
            return [o.object_name for o in objs if o.object_name]

        return await asyncio.to_thread(_list)

    async def presign_get(self, purpose: str, key: str, *, expires: timedelta = timedelta(hours=1)) -> str:
        return await asyncio.to_thread(self.client.presigned_get_object, self.bucket(purpose), key, expires)

    async def ping(self, *, timeout_s: float = 2.0) -> None:
        """Raise unless S3 answers a signed request within the timeout."""
        await asyncio.wait_for(asyncio.to_thread(self.client.list_buckets), timeout_s)
