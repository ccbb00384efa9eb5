"""A learned reward model as a judge: a transformers sequence-classification checkpoint,
optionally with a PEFT adapter, from a local folder or ``s3://bucket/prefix``.

Torch, transformers and peft are the optional extra ``flywheel-reward-judge[reward-model]``;
nothing here imports them until a model is loaded. A single-logit head is read through a
sigmoid, a two-class head as P(class 1). The tokenizer's pad token is set on the model's
config, so the head reads the last real token of each padded sequence (N3's reward model
scored a pad token)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

from flywheel.core.errors import FailedPrecondition
from flywheel.core.logging import get_logger

log = get_logger(__name__)
MAX_LENGTH = 512


def _download_s3(client: Any, uri: str, into: Path) -> Path:
    """Copy every object under s3://bucket/prefix into ``into``; return that folder."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    count = 0
    for obj in client.list_objects(bucket, prefix=prefix, recursive=True):
        name = obj.object_name
        if not name or name.endswith("/"):
            continue
        client.fget_object(bucket, name, str(into / name[len(prefix) :]))
        count += 1
    if count == 0:
        raise FailedPrecondition(f"reward model {uri}: no objects under that prefix")
    return into


class RewardModelJudge:
    """Scores (prompt, response) pairs in batches; loaded once, on first use."""

    def __init__(self, source: str, *, batch_size: int = 16, s3_client: Any = None) -> None:
        self.source = source
        self.judge_id = f"reward_model:{source}"
        self._batch_size = batch_size
        self._s3 = s3_client
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            try:
                import torch  # noqa: F401
                from transformers import AutoModelForSequenceClassification, AutoTokenizer
            except ImportError:
                raise FailedPrecondition(
                    "the reward-model judge needs torch and transformers: install flywheel-reward-judge[reward-model]"
                ) from None
            path = Path(self.source)
            if self.source.startswith("s3://"):
                if self._s3 is None:
                    raise FailedPrecondition(f"{self.source}: no S3 client configured")
                self._tmp = tempfile.TemporaryDirectory(prefix="flywheel-rm-")
                path = _download_s3(self._s3, self.source, Path(self._tmp.name))
            if not path.is_dir():
                raise FailedPrecondition(f"reward model folder {path} does not exist")
            if (path / "adapter_config.json").exists():
                from peft import PeftConfig, PeftModel

                base_name = PeftConfig.from_pretrained(str(path)).base_model_name_or_path
                has_tokenizer = (path / "tokenizer_config.json").exists()
                tokenizer = AutoTokenizer.from_pretrained(str(path) if has_tokenizer else base_name)
                base = AutoModelForSequenceClassification.from_pretrained(base_name)
                model = PeftModel.from_pretrained(base, str(path))
            else:
                tokenizer = AutoTokenizer.from_pretrained(str(path))
                model = AutoModelForSequenceClassification.from_pretrained(str(path))
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = tokenizer.pad_token_id
            model.eval()
            self._tokenizer, self._model = tokenizer, model
            log.info("reward model loaded", source=self.source)

    def warm(self) -> None:
        """Load (and download) the checkpoint now. Blocking: call in a thread."""
        self._load()

    def score_sync(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Scores in [0, 1], one per (prompt, response), in batches. Blocking."""
        import torch

        self._load()
        out: list[float] = []
        for start in range(0, len(pairs), self._batch_size):
            batch = pairs[start : start + self._batch_size]
            enc = self._tokenizer(
                [p for p, _ in batch],
                [r for _, r in batch],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            with torch.no_grad():
                logits = self._model(**enc).logits.float()
            # One logit: sigmoid; two classes: P(class 1).
            scores = torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)[:, 1]
            out += [float(x) for x in scores]
        return out

    async def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        return await asyncio.to_thread(self.score_sync, pairs)
