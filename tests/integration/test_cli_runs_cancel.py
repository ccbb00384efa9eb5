"""``flywheel runs cancel`` and ``flywheel runs list`` as users run them (separate processes)
against a real optimizer (issue 14): a running run is stopped, an ended one is refused, and
the list's reader going away ends the CLI quietly.

No evaluator is started, so a run stays running until it is cancelled. The optimizer is
``test_sdk_cli``'s module fixture."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.sdk.runs import RunsClient

from .test_runs import run_config
from .test_sdk_cli import module_env, optimizer  # noqa: F401 - fixtures for this module

pytestmark = pytest.mark.integration


def flywheel(target: str, *args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.Popen(
        [sys.executable, "-m", "flywheel.sdk.cli", "--target", target, *args],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_runs_cancel_and_a_closed_pipe_on_a_real_optimizer(optimizer):  # noqa: F811
    with RunsClient(target=optimizer.address) as runs:
        run = await asyncio.to_thread(runs.start, run_config(generations=50))
    assert run.state == runs_pb2.RUN_STATE_RUNNING

    proc = flywheel(optimizer.address, "runs", "cancel", run.run_id)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith(f"run {run.run_id} cancelled after ")
    with RunsClient(target=optimizer.address) as runs:
        assert (await asyncio.to_thread(runs.get, run.run_id)).state == runs_pb2.RUN_STATE_CANCELLED

    proc = flywheel(optimizer.address, "runs", "cancel", "no-such-run")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.startswith("error: ") and "Traceback" not in err

    # `flywheel runs list | head -0`: the reader is gone before the list is written.
    proc = flywheel(optimizer.address, "runs", "list")
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == ""
