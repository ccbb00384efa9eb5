"""flywheel.core.objects against the real S3 server (SeaweedFS) of the test session."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from minio.error import S3Error
from pydantic import SecretStr

from flywheel.core.objects import ObjectStore
from flywheel.core.settings import S3Settings

pytestmark = pytest.mark.integration


def settings_for(servers, prefix: str, secret: str | None = None) -> S3Settings:
    return S3Settings(
        endpoint=servers.s3.endpoint,
        access_key=servers.s3.access_key,
        secret_key=SecretStr(secret or servers.s3.secret_key),
        bucket_prefix=prefix,
    )


async def test_put_get_list_and_presign(servers, isolation):
    store = ObjectStore(settings_for(servers, isolation["bucket_prefix"]))
    bucket = await store.ensure_bucket("reports")
    assert bucket == f"{isolation['bucket_prefix']}-reports"
    assert await store.ensure_bucket("reports") == bucket  # idempotent

    uri = await store.put_bytes("reports", "run-1/report.md", b"# best config\n", content_type="text/markdown")
    await store.put_bytes("reports", "run-2/report.md", b"# other\n")
    assert uri == f"s3://{bucket}/run-1/report.md"
    assert await store.get_bytes("reports", "run-1/report.md") == b"# best config\n"
    assert await store.list_keys("reports", prefix="run-1/") == ["run-1/report.md"]
    assert sorted(await store.list_keys("reports")) == ["run-1/report.md", "run-2/report.md"]

    url = await store.presign_get("reports", "run-1/report.md")

    def fetch() -> bytes:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a loopback URL we just signed
            return resp.read()

    assert await asyncio.to_thread(fetch) == b"# best config\n"


async def test_wrong_secret_is_refused(servers, isolation):
    await ObjectStore(settings_for(servers, isolation["bucket_prefix"])).ping()
    bad = ObjectStore(settings_for(servers, isolation["bucket_prefix"], secret="not-the-secret"))
    with pytest.raises(S3Error, match=r"SignatureDoesNotMatch|AccessDenied|InvalidAccessKeyId"):
        await bad.ping()
