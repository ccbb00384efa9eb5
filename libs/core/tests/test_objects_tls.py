"""S3 over TLS with a private CA: FLYWHEEL_S3_CA_FILE is what the client trusts."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from pydantic import SecretStr

from flywheel.core.objects import ObjectStore
from flywheel.core.settings import S3Settings


class _BucketExists(http.server.BaseHTTPRequestHandler):
    """Answers S3's HEAD bucket with 200 (the bucket exists), enough for ensure_bucket."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_s3(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ca = trustme.CA()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BucketExists)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    try:
        yield f"127.0.0.1:{server.server_address[1]}", ca_file
    finally:
        server.shutdown()


def _settings(endpoint: str, ca_file: Path | None) -> S3Settings:
    return S3Settings(
        endpoint=endpoint, access_key="a", secret_key=SecretStr("b"), secure=True, ca_file=ca_file, region="us-east-1"
    )


async def test_the_private_ca_is_trusted_when_given(tls_s3) -> None:
    endpoint, ca_file = tls_s3
    assert await ObjectStore(_settings(endpoint, ca_file)).ensure_bucket("x") == "flywheel-x"


async def test_without_the_ca_the_server_is_refused(tls_s3) -> None:
    endpoint, _ = tls_s3
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await ObjectStore(_settings(endpoint, None)).ensure_bucket("x")
