"""One side of one comparison, run in its own process (forked from a server that imported
torch, transformers, TRL and PEFT once, so a run pays no import time and starts with fresh
memory): Flywheel's training library, or the plain TRL script."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import warnings
from typing import Any

import data
import datasets
import measure
import model
import plain_trl
import torch
import transformers

# transformers and TRL import lazily: name what the runs use, so the fork server imports it once.
from datasets import Dataset  # noqa: F401
from peft import LoraConfig  # noqa: F401
from transformers import (  # noqa: F401
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    TrainerCallback,
)
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer  # noqa: F401

from flywheel.trainer.training import models as _flywheel_models  # noqa: F401
from flywheel.trainer.training import run as _flywheel_run  # noqa: F401


class LogClock(TrainerCallback):
    """The peer's clock: the time of each step's log, and TRL's cumulative token count."""

    def __init__(self, clock: measure.StepClock) -> None:
        self.clock = clock

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.clock.mark(state.global_step, logs.get("num_tokens"))


def run_flywheel(
    kind: str, p: dict[str, Any], model_dir: str, out_dir: str, clock: measure.StepClock
) -> dict[str, Any]:
    """Flywheel's side: ``flywheel.trainer.training.train`` with the model folder as base model.
    Its progress reports (one per logged step) set the clock."""
    from flywheel.trainer.training import LoraSettings, RewardFunction, TrainSpec, train

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    steps = p["warmup_steps"] + p["measured_steps"]
    beta = {"dpo": p["dpo_beta"], "grpo": p["grpo_beta"]}.get(kind)
    spec = TrainSpec(
        kind=kind,
        base_model=model_dir,
        max_steps=steps,
        learning_rate=p["learning_rate"],
        batch_size=p["batch_size"],
        max_length=data.max_length(p),
        save_steps=steps,  # its one checkpoint after the last (timed) step
        seed=p["seed"],
        lora=LoraSettings(
            r=p["lora_r"], alpha=p["lora_alpha"], dropout=p["lora_dropout"], target_modules=tuple(p["lora_targets"])
        ),
        beta=beta,
        num_generations=p["num_generations"],
        max_completion_length=p["completion_length"],
        temperature=p["temperature"],
        rewards=(RewardFunction(fn=data.reward, name="text_hash"),) if kind == "grpo" else (),
        device=p["device"],
    )
    reported: dict[int, float | None] = {}

    def on_progress(report: Any) -> None:
        clock.mark(report.step)
        reported[report.step] = report.tokens_per_s

    result = train(spec, data.rows(kind, p, tokenizer), out_dir, on_progress=on_progress)
    window = range(p["warmup_steps"] + 1, steps + 1)
    own = [reported[s] for s in window if reported.get(s) is not None]
    return {
        "final_loss": result.final_loss,
        # Flywheel's own progress events (TRL's token count over its own clock): a cross-check.
        "progress_tokens_per_s": round(sum(own) / len(own), 1) if own else None,
    }


def run_trl(kind: str, p: dict[str, Any], model_dir: str, out_dir: str, clock: measure.StepClock) -> dict[str, Any]:
    trainer = plain_trl.train(kind, p, model_dir, out_dir, [LogClock(clock)])
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"final_loss": losses[-1] if losses else None}


def run_side(side: str, kind: str, p: dict[str, Any], model_dir: str, matmul_params: int) -> dict[str, Any]:
    """Train ``kind`` on ``side`` ("flywheel" or "trl") and return its figures."""
    started = time.perf_counter()
    if not p.get("verbose"):
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        datasets.disable_progress_bars()
        warnings.simplefilter("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    clock = measure.StepClock()
    # stdout is the parent's table and JSON: the trainers' own log lines go to stderr.
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-trainer-{side}-{kind}-") as out_dir,
        contextlib.redirect_stdout(sys.stderr),
    ):
        extra = (run_flywheel if side == "flywheel" else run_trl)(kind, p, model_dir, out_dir, clock)
    name = measure.device_name(p["device"])
    return {
        "side": side,
        "kind": kind,
        "device_name": name,
        "threads": torch.get_num_threads(),
        **measure.figures(
            clock,
            warmup=p["warmup_steps"],
            measured=p["measured_steps"],
            tokens_per_step=data.tokens_per_step(kind, p),
            samples_per_step=data.samples_per_step(kind, p),
            matmul_params=matmul_params,
            peak_bytes=measure.peak_memory_bytes(p["device"]),
            peak_flops_per_s=measure.peak_flops(name, p.get("peak_tflops")),
        ),
        **extra,
        "process_s": round(time.perf_counter() - started, 2),
    }


def build_model(size: str, folder: str, dtype: str) -> dict[str, Any]:
    """Build the model folder in a forked process too: the fork server itself never runs torch
    code (OpenMP and CUDA must not be started in a process that forks)."""
    from pathlib import Path

    return model.build_folder(size, Path(folder), dtype=dtype)


def resolve_device(requested: str) -> str:
    """'auto': cuda when present, else cpu; a cuda request fails here without a GPU."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {requested}: no CUDA device here")
    return requested
