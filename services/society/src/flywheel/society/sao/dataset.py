"""SAO records and datasets: JSONL import/export and publication to S3 in the trace store's
export format, which the trainer reads (``trainer/jobs/datasets.py``).

A record keeps The Convergence's keys (``prompt``, ``chosen``, ``rejected``, ``iteration``,
``timestamp``) plus the persona and the reward judge's mean scores. Published, the dataset
is ``preference/<dataset_id>/{train,validation}.jsonl`` and ``manifest.json`` in the
``datasets`` bucket, split by prompt exactly as the trace store splits (no prompt in both)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flywheel.society.sao.filters import text_key

PURPOSE = "datasets"
KIND = "preference"
REQUIRED_TEXT = ("prompt", "chosen", "rejected")


class DatasetImportError(ValueError):
    """A JSONL import that cannot be read; the message names the line."""


@dataclass(frozen=True)
class SaoRecord:
    prompt: str
    chosen: str
    rejected: str
    iteration: int
    timestamp: str  # ISO 8601, UTC
    persona: str = ""
    chosen_score: float = 0.0  # the reward judge's mean over both orders
    rejected_score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PublishedDataset:
    dataset_id: str
    manifest_uri: str
    train_rows: int
    validation_rows: int
    unique_prompts: int


def _record(obj: Any, line: int) -> SaoRecord:
    where = f"line {line}"
    if not isinstance(obj, dict):
        raise DatasetImportError(f"{where}: a JSON object is expected, got {type(obj).__name__}")
    for key in REQUIRED_TEXT:
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            raise DatasetImportError(f"{where}: {key!r} must be a non-empty string")
    if obj["chosen"] == obj["rejected"]:
        raise DatasetImportError(f"{where}: 'chosen' and 'rejected' are the same text")
    iteration = obj.get("iteration", 0)
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise DatasetImportError(f"{where}: 'iteration' must be a non-negative integer, got {iteration!r}")
    timestamp = obj.get("timestamp")
    if isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool) and math.isfinite(timestamp):
        timestamp = datetime.fromtimestamp(timestamp, UTC).isoformat()  # The Convergence wrote epoch seconds
    if not isinstance(timestamp, str):
        raise DatasetImportError(f"{where}: 'timestamp' must be an ISO 8601 string or epoch seconds")
    try:
        datetime.fromisoformat(timestamp)
    except ValueError:
        raise DatasetImportError(f"{where}: 'timestamp' {timestamp!r} is not ISO 8601") from None
    scores = {}
    for key in ("chosen_score", "rejected_score"):
        v = obj.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise DatasetImportError(f"{where}: {key!r} must be a finite number")
        scores[key] = float(v)
    persona = obj.get("persona", "")
    if not isinstance(persona, str):
        raise DatasetImportError(f"{where}: 'persona' must be a string")
    return SaoRecord(obj["prompt"], obj["chosen"], obj["rejected"], iteration, timestamp, persona, **scores)


class SaoDataset:
    """Preference records in order; ``prompts()`` and the key set serve the duplicate filter."""

    def __init__(self, records: Iterable[SaoRecord] = ()) -> None:
        self.records: list[SaoRecord] = list(records)

    def __len__(self) -> int:
        return len(self.records)

    def extend(self, records: Iterable[SaoRecord]) -> None:
        self.records.extend(records)

    def prompts(self) -> list[str]:
        return [r.prompt for r in self.records]

    def unique_prompts(self) -> int:
        return len({text_key(r.prompt) for r in self.records})

    # --- JSONL ------------------------------------------------------------------------------

    def to_jsonl(self) -> str:
        return "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in self.records)

    def export_jsonl(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_jsonl(), encoding="utf-8")
        return p

    @classmethod
    def from_jsonl(cls, text: str) -> SaoDataset:
        """Parse JSONL; blank lines are skipped, anything else malformed is refused with
        :class:`DatasetImportError` naming its (1-based) line number."""
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetImportError(f"line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
            records.append(_record(obj, n))
        return cls(records)

    @classmethod
    def import_jsonl(cls, path: str | Path) -> SaoDataset:
        return cls.from_jsonl(Path(path).read_text(encoding="utf-8"))

    # --- the trace store's export format -----------------------------------------------------

    def split(self, validation_fraction: float) -> tuple[list[SaoRecord], list[SaoRecord]]:
        """Train and validation by prompt, the trace store's rule: prompt keys ordered by the
        sha256 of the key, the first ceil(fraction·prompts) held out, at least one kept for
        training."""
        if not 0 <= validation_fraction < 1:
            raise ValueError(f"validation_fraction {validation_fraction}: must be in [0, 1)")
        groups: dict[str, list[SaoRecord]] = {}
        for r in self.records:
            groups.setdefault(prompt_key(r.prompt), []).append(r)
        keys = sorted(groups, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
        n_val = min(math.ceil(validation_fraction * len(keys)), max(len(keys) - 1, 0))
        return [r for k in keys[n_val:] for r in groups[k]], [r for k in keys[:n_val] for r in groups[k]]

    async def publish(
        self,
        objects: Any,
        *,
        validation_fraction: float = 0.1,
        params: dict[str, Any] | None = None,
        stats: dict[str, Any] | None = None,
        dataset_id: str | None = None,
    ) -> PublishedDataset:
        """Write train/validation JSONL and the manifest to the ``datasets`` bucket of
        ``objects`` (a ``flywheel.core.objects.ObjectStore``); returns the manifest's URI,
        which a trainer job takes as its ``dataset_uri``."""
        if not self.records:
            raise ValueError("dataset: no records to publish")
        train, validation = self.split(validation_fraction)
        dataset_id = dataset_id or f"sao-{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:12]}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", dataset_id):
            raise ValueError(f"dataset_id {dataset_id!r}: letters, digits, '.', '_' and '-' only")
        await objects.ensure_bucket(PURPOSE)
        prefix = f"{KIND}/{dataset_id}"
        files = []
        for split, rows in (("train", train), ("validation", validation)):
            data = "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in rows).encode()
            key = f"{prefix}/{split}.jsonl"
            await objects.put_bytes(PURPOSE, key, data, content_type="application/x-ndjson")
            files.append(
                {
                    "split": split,
                    "key": key,
                    "rows": len(rows),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data),
                }
            )
        manifest = {
            "dataset_id": dataset_id,
            "kind": KIND,
            "source": "society.sao",
            "created_at": datetime.now(UTC).isoformat(),
            "format": "jsonl",
            "bucket": objects.bucket(PURPOSE),
            "files": files,
            "params": params or {},
            "stats": stats or {},
            "split": "by prompt: no prompt is in both train and validation",
            "source_traces": [],
        }
        uri = await objects.put_bytes(
            PURPOSE, f"{prefix}/manifest.json", json.dumps(manifest, indent=1).encode(), content_type="application/json"
        )
        return PublishedDataset(dataset_id, uri, len(train), len(validation), self.unique_prompts())


def prompt_key(prompt: str) -> str:
    """The trace store's prompt key: whitespace collapsed, lower case."""
    return re.sub(r"\s+", " ", prompt).strip().lower()
