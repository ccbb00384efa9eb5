"""One entry point for every kind: ``train(spec, rows, output_dir, ...)``.

Layout of ``output_dir`` after a run::

    checkpoints/checkpoint-<step>/   resumable state (adapter, optimizer, scheduler, RNG, trainer state)
    adapter/                         the LoRA adapter and the tokenizer, what the model server loads
    training_results.json            histories, flat groups, dataset sha256, package versions
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from flywheel.trainer.training.common import Context
from flywheel.trainer.training.lora import lora_config
from flywheel.trainer.training.models import load_for_training
from flywheel.trainer.training.progress import REWARD_KEYS, Progress, ProgressCallback, pick
from flywheel.trainer.training.rewards import combined_reward
from flywheel.trainer.training.spec import TrainSpec

log = logging.getLogger(__name__)

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
RESULTS_FILE = "training_results.json"


@dataclass
class TrainResult:
    """What a finished (or stopped) run produced."""

    kind: str
    global_step: int
    stopped: bool  # should_stop() ended it before max_steps
    adapter_dir: str
    checkpoint_dir: str | None  # the last checkpoint, to resume from
    results_path: str
    loss: list[dict[str, float]] = field(default_factory=list)  # [{"step": s, "value": v}, ...]
    reward: list[dict[str, float]] = field(default_factory=list)
    kl: list[dict[str, float]] = field(default_factory=list)
    flat_groups: int | None = None  # GRPO/RLOO: groups whose completions all got the same reward
    groups: int | None = None
    dataset_sha256: str = ""
    dataset_rows: int = 0
    lora_target_modules: list[str] = field(default_factory=list)
    base_model: str = ""
    base_source: str = ""
    device: str = "cpu"
    resumed_from: str | None = None
    runtime_s: float = 0.0
    packages: dict[str, str] = field(default_factory=dict)

    @property
    def final_loss(self) -> float | None:
        return self.loss[-1]["value"] if self.loss else None


def dataset_sha256(rows: Iterable[dict[str, Any]]) -> str:
    """sha256 of the rows as canonical JSON lines (sorted keys): the same rows, the same digest."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _kind_module(kind: str) -> Any:
    return importlib.import_module(f"flywheel.trainer.training.{kind}")


def check_dataset(spec: TrainSpec, rows: list[dict[str, Any]]) -> None:
    """Refuse a dataset this kind cannot train on, naming what is wrong."""
    if not rows:
        raise ValueError("dataset: no rows")
    columns = set(rows[0])
    for i, row in enumerate(rows):
        if set(row) != columns:
            raise ValueError(f"dataset: row {i} has columns {sorted(row)}, row 0 has {sorted(columns)}")
    _kind_module(spec.kind).check_columns(columns)
    if spec.kind == "kto" and not all(isinstance(row["label"], bool) for row in rows):
        raise ValueError("dataset: kto's label column must be true (desirable) or false (undesirable)")


def train(
    spec: TrainSpec,
    dataset_rows: list[dict[str, Any]],
    output_dir: str | Path,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    resume_from: str | Path | None = None,
    callbacks: Sequence[Any] = (),
) -> TrainResult:
    """Train ``spec.kind`` with LoRA on ``dataset_rows`` until ``spec.max_steps`` (or until
    ``should_stop()``), writing checkpoints, the adapter and training_results.json under
    ``output_dir``. ``resume_from``: a checkpoint directory; the step counter, optimizer and
    scheduler continue from it. ``callbacks``: more transformers TrainerCallbacks (the job
    runner's checkpoint upload)."""
    from datasets import Dataset

    started = time.monotonic()
    rows = list(dataset_rows)
    check_dataset(spec, rows)
    if resume_from is not None and not (Path(resume_from) / "trainer_state.json").is_file():
        raise FileNotFoundError(f"resume_from {str(resume_from)!r}: not a checkpoint (no trainer_state.json)")
    module = _kind_module(spec.kind)
    reward_model = getattr(module, "REWARD_MODEL", False)
    loaded = load_for_training(spec.base_model, reward_model=reward_model, device=spec.device)
    peft_config = lora_config(loaded.model, spec.lora, reward_model=reward_model)
    reward = combined_reward(spec.rewards, spec.num_generations) if spec.rewards else None
    callback = ProgressCallback(on_progress, should_stop, reward)
    out = Path(output_dir)
    ctx = Context(
        spec=spec,
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        dataset=Dataset.from_list(rows),
        peft_config=peft_config,
        callbacks=[callback, *callbacks],
        checkpoints=out / "checkpoints",
        device=loaded.device,
        reward=reward,
    )
    trainer = module.build(ctx)
    for function in spec.rewards:
        # Rewards that score with the policy's own model (information gain: the adapter-free
        # base) get it once TRL has wrapped it with the adapter.
        bind = getattr(function.fn, "bind_trainer", None)
        if callable(bind):
            bind(trainer)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # progress goes to on_progress, not stdout
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)

    adapter_dir = out / "adapter"
    trainer.save_model(str(adapter_dir))
    loaded.tokenizer.save_pretrained(str(adapter_dir))
    history = trainer.state.log_history  # includes the steps before a resume: the state is restored
    result = TrainResult(
        kind=spec.kind,
        global_step=trainer.state.global_step,
        stopped=callback.stopped,
        adapter_dir=str(adapter_dir),
        checkpoint_dir=_last_checkpoint(ctx.checkpoints),
        results_path=str(out / RESULTS_FILE),
        loss=_series(history, ("loss",)),
        reward=_series(history, REWARD_KEYS),
        kl=_series(history, ("kl",)),
        flat_groups=reward.flat_groups if reward is not None else None,
        groups=reward.groups if reward is not None else None,
        dataset_sha256=dataset_sha256(rows),
        dataset_rows=len(rows),
        lora_target_modules=sorted(peft_config.target_modules),
        base_model=spec.base_model,
        base_source=loaded.source,
        device=loaded.device,
        resumed_from=str(resume_from) if resume_from is not None else None,
        runtime_s=round(time.monotonic() - started, 3),
        packages={name: version(name) for name in PACKAGES},
    )
    if result.final_loss is None or not math.isfinite(result.final_loss):
        log.warning("%s run ended with loss %s", spec.kind, result.final_loss)
    payload = {
        **asdict(result),
        "spec": spec.model_dump(mode="json", exclude={"rewards", "multi_turn"}),
        "rewards": [{"name": r.label, "weight": r.weight} for r in spec.rewards],
        "multi_turn": _multi_turn_summary(spec),
    }
    Path(result.results_path).write_text(json.dumps(payload, indent=2, default=str))
    return result


def _multi_turn_summary(spec: TrainSpec) -> dict[str, Any] | None:
    if spec.multi_turn is None:
        return None
    environment = spec.multi_turn.environment
    name = getattr(environment, "__qualname__", type(environment).__name__)
    return {"environment": f"{getattr(environment, '__module__', '?')}:{name}", "max_turns": spec.multi_turn.max_turns}


def _series(history: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, float]]:
    series = []
    for entry in history:
        if "loss" not in entry or "step" not in entry:
            continue
        value = pick(entry, keys)
        if value is not None:
            series.append({"step": entry["step"], "value": value})
    return series


def _last_checkpoint(folder: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(folder)) if folder.is_dir() else None
