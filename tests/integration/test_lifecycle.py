"""SIGTERM: every service stops accepting, drains and exits 0 within 10 s."""

from __future__ import annotations

import time

import pytest

from flywheel.stack.services import SERVICES

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", SERVICES)
def test_sigterm_exits_cleanly_within_10s(launch, name):
    proc = launch(name)
    started = time.monotonic()
    code = proc.stop(timeout_s=10.0)
    elapsed = time.monotonic() - started
    assert code == 0, f"{name} exited with {code} after {elapsed:.1f}s:\n{proc.log_tail()}"
    assert elapsed < 10.0
    assert '"event": "stopped"' in proc.log_file.read_text()
