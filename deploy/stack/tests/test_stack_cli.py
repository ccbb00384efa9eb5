"""``flywheel-stack env`` from any folder: the nearest ``.flywheel`` upwards, else the folder
the last ``up`` recorded, else a message that says where it looked (issue 14).

The stack's state file is written by the real ``Stack.create(...).save()`` (ports and
secrets chosen, nothing started): ``env`` only reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.stack import cli
from flywheel.stack.stack import Stack


def stack_env(cwd: Path, state_home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(XDG_STATE_HOME=str(state_home), **extra)
    return subprocess.run(
        [sys.executable, "-m", "flywheel.stack.cli", "env"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def saved_stack(tmp_path: Path) -> Stack:
    stack = Stack.create(tmp_path / "repo" / ".flywheel", services=("optimizer",))
    stack.save()
    return stack


def test_env_works_from_a_subfolder_and_from_anywhere_after_up(saved_stack: Stack, tmp_path: Path, monkeypatch):
    address = f"export FLYWHEEL_OPTIMIZER_ADDRESS={saved_stack.services['optimizer'].address}"
    deep = tmp_path / "repo" / "libs" / "sdk"
    deep.mkdir(parents=True)
    state_home = tmp_path / "state"

    done = stack_env(deep, state_home)  # a folder below the repository: found walking up
    assert done.returncode == 0, done.stderr
    assert address in done.stdout.splitlines() and "export FLYWHEEL_NATS_URL=" in done.stdout

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = stack_env(elsewhere, state_home)  # nothing recorded yet: says where it looked
    assert done.returncode == 1 and done.stdout == ""
    assert "no stack recorded in" in done.stderr and "flywheel-stack up" in done.stderr
    assert str(state_home / "flywheel" / "stack-dir") in done.stderr

    monkeypatch.setenv("XDG_STATE_HOME", str(state_home))
    cli._record(saved_stack.root.resolve())  # what `up` does once the stack is SERVING
    done = stack_env(elsewhere, state_home)
    assert done.returncode == 0, done.stderr
    assert address in done.stdout.splitlines()

    # $FLYWHEEL_STACK_DIR still wins (a second stack elsewhere).
    done = stack_env(elsewhere, state_home, FLYWHEEL_STACK_DIR=str(tmp_path / "other"))
    assert done.returncode == 1 and f"no stack recorded in {tmp_path / 'other'};" in done.stderr

    cli._forget(saved_stack.root.resolve())  # what `down` does
    assert not (state_home / "flywheel" / "stack-dir").exists()
