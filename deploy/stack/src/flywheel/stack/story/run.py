"""Tell the whole story on a running stack: optimize → traffic → training → canary, each
stage timed, into one :class:`StoryRecord`; and start the stack the story needs
(``start_story_stack``: the six services and a model server that loads canary adapters)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from flywheel.stack.servers import ModelServer
from flywheel.stack.stack import Stack
from flywheel.stack.story import world
from flywheel.stack.story.context import QuietProgress, StoryContext, StoryHooks, StoryProgress, StorySizes
from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.training import trainer_base

Stage = Callable[[StoryContext], Awaitable[None]]
REPO = Path(__file__).resolve().parents[5]
CHECKPOINTS_BUCKET = "flywheel-checkpoints"  # the trainer's <prefix>-checkpoints, where adapters land

# The trainer as the story runs it: canaries followed every second, a small held-out
# evaluation, short acknowledgement waits (a killed trainer's job is picked up again soon).
TRAINER_ENV = {
    "FLYWHEEL_TRAINER_ACK_WAIT_S": "10",
    "FLYWHEEL_TRAINER_CANCEL_POLL_S": "0.5",
    "FLYWHEEL_TRAINER_EVAL_MAX_SAMPLES": "4",
    "FLYWHEEL_TRAINER_EVAL_MAX_NEW_TOKENS": "8",
    "FLYWHEEL_TRAINER_CANARY_FOLLOW_S": "1",
}
# A killed evaluator's requests come back after 8 s instead of the catalogue's 30 (a live one
# keeps its in-flight requests alive every third of that).
EVALUATOR_ENV = {"FLYWHEEL_EVALUATOR_ACK_WAIT_S": "8"}
# Likewise what a killed trace store held (decisions, feedback, span batches) comes back after 8 s:
# the traffic stage's wait for them after the kill drill's outage (its handlers write one batch
# in well under a second, so none is redelivered while it is being stored).
TRACE_STORE_ENV = {"FLYWHEEL_TRACE_STORE_ACK_WAIT_S": "8"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class StoryModelServer(ModelServer):
    """The local model server with runtime LoRA loading on, reading adapters from the stack's
    checkpoints bucket (where the trainer puts each version's adapter)."""

    _state_fields = ("port", "model", "adapters", "api_key")

    def __init__(self, data_dir: Path, *, model: str, s3_env: Mapping[str, str]) -> None:
        super().__init__(data_dir, model=model)
        self.s3_env = {k: v for k, v in s3_env.items() if k.startswith("FLYWHEEL_S3_")}

    def _command(self) -> list[str]:
        return [*super()._command(), "--allow-runtime-lora", f"--lora-bucket={CHECKPOINTS_BUCKET}", "--max-loras", "4"]

    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs = super()._popen_kwargs()
        kwargs["env"] = {**kwargs["env"], **self.s3_env, **OFFLINE_ENV}
        return kwargs


def served_model(model: ModelServer) -> str:
    """The model server's base model name (the first that /v1/models lists)."""
    listed = httpx.get(f"{model.url}/models", headers={"Authorization": f"Bearer {model.api_key}"}, timeout=10)
    listed.raise_for_status()
    return str(listed.json()["data"][0]["id"])


def start_story_stack(root: Path, sizes: StorySizes) -> tuple[Stack, ModelServer]:
    """Create and start the six services (with NATS, PostgreSQL, S3) under ``root/stack`` and
    the model server under ``root/modelserver``, wired for the story (``world.prepare_stack``;
    the trainer enrols canaries on the optimizer and asks the model server to load their
    adapters). On failure nothing started is left running."""
    stack = Stack.create(root / "stack")
    model = StoryModelServer(root / "modelserver", model=sizes.base_model, s3_env=stack.servers.env())
    trainer = stack.services["trainer"].env
    trainer.update(TRAINER_ENV)
    trainer.update(OFFLINE_ENV)
    stack.services["evaluator"].env.update(EVALUATOR_ENV)
    stack.services["trace_store"].env.update(TRACE_STORE_ENV)
    trainer["FLYWHEEL_TRAINER_MODELSERVER_URL"] = model.url
    trainer["FLYWHEEL_TRAINER_MODELSERVER_API_KEY"] = model.api_key
    trainer.setdefault("FLYWHEEL_TRAINER_WORK_DIR", str(root / "trainer-work"))
    try:
        # The model server loads while the servers start and migrate; the services wait for
        # it (the society and the judge are told its served model name).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelserver") as pool:
            loading = pool.submit(model.start)  # it needs no server: S3 is read per adapter
            stack.prepare()
            loading.result()
        world.prepare_stack(stack, model)
        stack.start_services()
    except BaseException:
        stop_story_stack(stack, model)
        raise
    return stack, model


def stop_story_stack(stack: Stack, model: ModelServer) -> None:
    """Stop what ``start_story_stack`` started: the six services and the model server at once
    (each drains on SIGTERM; ``stack.down`` alone stops the services one after another), then
    the servers (``stack.down``: NATS, PostgreSQL and S3 outlive every service that uses them).
    Raises the first failure once everything was asked to stop."""
    try:
        with ThreadPoolExecutor(max_workers=len(stack.services) + 1, thread_name_prefix="stop") as pool:
            stopping = [pool.submit(proc.stop) for proc in stack.services.values()]
            stopping.append(pool.submit(model.stop))
            for done in stopping:
                done.result()
    finally:
        try:
            stack.down()  # the services are stopped already (their pid files are gone): the servers
        finally:
            model.stop()  # idempotent: a no-op unless stopping it above failed


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def stages() -> list[tuple[str, Stage]]:
    """The four stages in order."""
    from flywheel.stack.story.canary import canary
    from flywheel.stack.story.optimize import optimize
    from flywheel.stack.story.traffic import traffic
    from flywheel.stack.story.training import train

    return [("optimize", optimize), ("traffic", traffic), ("training", train), ("canary", canary)]


def story_context(
    stack: Stack,
    model: ModelServer,
    sizes: StorySizes,
    *,
    progress: StoryProgress | None = None,
    hooks: StoryHooks | None = None,
) -> StoryContext:
    """The context every stage gets, its record's ``meta`` filled (commit, command, machine...)."""
    served = served_model(model)
    ctx = StoryContext(stack=stack, model=model, sizes=sizes, served_model=served)
    ctx.progress = progress or QuietProgress()
    if hooks is not None:
        ctx.hooks = hooks
    ctx.record.meta = {
        "commit": _commit(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sizes": asdict(sizes),
        "models": {"served": served, "trainer_base": trainer_base(served)},
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "stage_seconds": {},
    }
    return ctx


async def tell_story(
    stack: Stack,
    model: ModelServer,
    sizes: StorySizes,
    *,
    progress: StoryProgress | None = None,
    hooks: StoryHooks | None = None,
) -> StoryRecord:
    """Run every stage in order on ``stack`` (started, e.g. by ``start_story_stack``) and
    ``model``; returns the record (``meta.seconds`` and ``meta.stage_seconds`` timed here)."""
    ctx = story_context(stack, model, sizes, progress=progress, hooks=hooks)
    await run_stages(ctx, stages())
    return ctx.record


async def run_stages(ctx: StoryContext, todo: list[tuple[str, Stage]]) -> None:
    """Run ``todo`` in order on ``ctx``, timing each into ``meta.stage_seconds``."""
    began = time.monotonic()
    try:
        for name, stage in todo:
            started = time.monotonic()
            try:
                await stage(ctx)
            finally:
                ctx.record.meta.setdefault("stage_seconds", {})[name] = round(time.monotonic() - started, 2)
    finally:
        ctx.record.meta["seconds"] = round(time.monotonic() - began, 2)
