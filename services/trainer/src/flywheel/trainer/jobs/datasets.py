"""A job's dataset: read a manifest and its JSONL files from S3, verify them, and check the rows
against what the job's kind trains on.

The manifest layout is the trace store's ExportDataset (``trace_store/exports.py``)::

    {"format": "jsonl", "bucket": "<bucket>", "kind": "preference",
     "files": [{"split": "train", "key": ".../train.jsonl", "rows": 9, "sha256": "..."}, ...],
     "source_traces": [...], ...}

Any manifest with the same layout is accepted, whoever wrote it: the society's SAO datasets
(issue 16) do not exist yet and are expected to follow it. ``bucket`` may be left out (the
manifest's own bucket); several files per split are read in order; splits other than train and
validation are skipped with a warning.

Rows keep TRL's column names. Two adjustments:

- ``trace_ids`` (and ``trace_id``) are provenance, not training input: they are dropped from the
  rows and counted in ``LoadedDataset.source_traces``.
- The trace store's reward export has ``prompt``/``response``/``score``; ``response`` is renamed
  ``completion``, the name the ``reward_model`` kind takes for scored rows (it turns scores into
  chosen/rejected pairs itself) and the one SFT and KTO use.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flywheel.core.objects import ObjectStore
from flywheel.trainer.training.spec import KINDS

MiB = 1024 * 1024
DEFAULT_MAX_BYTES = 512 * MiB
MAX_MANIFEST_BYTES = 64 * MiB  # a manifest lists every source trace id, so it can be large
SPLITS = ("train", "validation")
PROVENANCE_COLUMNS = ("trace_ids", "trace_id")
# Columns that must hold non-empty text (conversations go in ``messages``).
TEXT_COLUMNS = ("prompt", "completion", "chosen", "rejected", "text")
NUMBER_COLUMNS = ("score", "margin", "chosen_score", "rejected_score")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DatasetError(ValueError):
    """The manifest or a file it names is missing, malformed, or not what the manifest says."""


@dataclass
class LoadedDataset:
    """A dataset as the trainer takes it: rows per split, the manifest and its digest."""

    train: list[dict[str, Any]]
    validation: list[dict[str, Any]]
    manifest: dict[str, Any]
    manifest_sha256: str  # sha256 of the manifest's bytes: what training_results.json records
    columns: set[str]  # every column of the rows, after dropping provenance and renaming
    source_traces: int = 0  # distinct trace ids behind the rows (0 when the dataset names none)
    warnings: list[str] = field(default_factory=list)


def parse_manifest_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/path/manifest.json`` -> (bucket, key). ValueError naming the problem."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ValueError(f"dataset_uri {uri!r}: must start with s3:// (the manifest the dataset export returned)")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"dataset_uri {uri!r}: {bucket!r} is not an S3 bucket name")
    if not key or key.endswith("/"):
        raise ValueError(f"dataset_uri {uri!r}: no object key after the bucket (expected .../manifest.json)")
    if not key.endswith(".json"):
        raise ValueError(f"dataset_uri {uri!r}: not a manifest (expected a .json key such as .../manifest.json)")
    return bucket, key


async def load_dataset(objects: ObjectStore, manifest_uri: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> LoadedDataset:
    """Read the manifest at ``manifest_uri`` and its train/validation JSONL files, refusing a
    file whose sha256 or row count differs from the manifest's, and more than ``max_bytes``
    of files in all (the manifest has its own cap, ``MAX_MANIFEST_BYTES``). DatasetError (a
    ValueError) for anything wrong with the dataset itself; S3 being unreachable raises the
    client's own error (worth a retry)."""
    bucket, key = parse_manifest_uri(manifest_uri)
    raw = await _read(objects, bucket, key, MAX_MANIFEST_BYTES, "manifest")
    manifest = _manifest(raw, manifest_uri)
    files_bucket = manifest.get("bucket") or bucket
    if not isinstance(files_bucket, str) or not _BUCKET.match(files_bucket):
        raise DatasetError(f"manifest {manifest_uri}: 'bucket' {files_bucket!r} is not an S3 bucket name")
    rows: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    warnings: list[str] = []
    entries = [_file_entry(entry, i, manifest_uri) for i, entry in enumerate(manifest["files"])]
    if not any(split == "train" for split, *_ in entries):
        raise DatasetError(f"manifest {manifest_uri}: no file with split 'train'")
    budget = max_bytes
    for i, (split, file_key, expected_rows, sha) in enumerate(entries):
        if split not in SPLITS:
            warnings.append(f"manifest file {file_key!r}: split {split!r} skipped (only train and validation are used)")
            continue
        data = await _read(objects, files_bucket, file_key, budget, f"files[{i}]")
        budget -= len(data)
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha:
            raise DatasetError(
                f"s3://{files_bucket}/{file_key}: sha256 {digest} differs from the manifest's {sha} "
                "(the file changed after export; export the dataset again)"
            )
        parsed = _jsonl(data, f"s3://{files_bucket}/{file_key}")
        if expected_rows is not None and len(parsed) != expected_rows:
            raise DatasetError(f"s3://{files_bucket}/{file_key}: {len(parsed)} rows, the manifest says {expected_rows}")
        rows[split].extend(parsed)
    traces: set[str] = {str(t) for t in manifest.get("source_traces") or () if isinstance(t, str)}
    train = [_training_row(r, traces) for r in rows["train"]]
    validation = [_training_row(r, traces) for r in rows["validation"]]
    columns = {c for r in train + validation for c in r}
    return LoadedDataset(
        train=train,
        validation=validation,
        manifest=manifest,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        columns=columns,
        source_traces=len(traces),
        warnings=warnings,
    )


async def _read(objects: ObjectStore, bucket: str, key: str, limit: int, what: str) -> bytes:
    if limit <= 0:
        raise DatasetError(f"s3://{bucket}/{key} ({what}): the dataset is over its size limit")
    try:
        return await objects.get_object(bucket, key, max_bytes=limit)
    except FileNotFoundError as exc:
        raise DatasetError(f"s3://{bucket}/{key} ({what}): no such object") from exc
    except ValueError as exc:
        raise DatasetError(f"s3://{bucket}/{key} ({what}): over the dataset's size limit ({limit} bytes left)") from exc


def _manifest(raw: bytes, uri: str) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"manifest {uri}: not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise DatasetError(f"manifest {uri}: a JSON object is expected, got {type(manifest).__name__}")
    fmt = manifest.get("format", "jsonl")
    if fmt != "jsonl":
        raise DatasetError(f"manifest {uri}: format {fmt!r} is not supported (only jsonl)")
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise DatasetError(f"manifest {uri}: 'files' must be a non-empty list of {{split, key, rows, sha256}}")
    return manifest


def _file_entry(entry: Any, i: int, uri: str) -> tuple[str, str, int | None, str]:
    where = f"manifest {uri}: files[{i}]"
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: an object {{split, key, rows, sha256}} is expected")
    split, key, rows, sha = entry.get("split"), entry.get("key"), entry.get("rows"), entry.get("sha256")
    if not isinstance(split, str) or not split:
        raise DatasetError(f"{where}.split: a split name (train, validation) is required")
    if not isinstance(key, str) or not key or key.startswith("/"):
        raise DatasetError(f"{where}.key: an object key in the manifest's bucket is required")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise DatasetError(f"{where}.rows: must be a non-negative integer, got {rows!r}")
    if not isinstance(sha, str) or not _SHA256.match(sha.lower()):
        raise DatasetError(f"{where}.sha256: the file's hex sha256 is required (it is verified)")
    return split, key, rows, sha.lower()


def _jsonl(data: bytes, where: str) -> list[dict[str, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{where}: not UTF-8 ({exc})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where} line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where} line {n}: a JSON object is expected, got {type(row).__name__}")
        rows.append(row)
    return rows


def _training_row(row: dict[str, Any], traces: set[str]) -> dict[str, Any]:
    """Drop provenance into ``traces``; the reward export's ``response`` becomes ``completion``."""
    out = {}
    for column, value in row.items():
        if column in PROVENANCE_COLUMNS:
            values = value if isinstance(value, list) else [value]
            traces.update(str(v) for v in values if isinstance(v, str))
        else:
            out[column] = value
    if "response" in out and "completion" not in out:
        out["completion"] = out.pop("response")
    return out


def check_rows(
    kind: str, train: list[dict[str, Any]], validation: list[dict[str, Any]], *, min_samples: int = 10
) -> list[str]:
    """Refuse rows the ``kind`` cannot train on, with a message a person can act on (the
    column, the split and the row); return warnings about rows it can train on but badly.

    Refused: no training rows, fewer than ``min_samples``, columns the kind does not take
    (each kind's ``check_columns``), rows whose columns differ, a text column (prompt,
    completion, chosen, rejected, text) that is not a non-empty string, ``messages`` that are
    not a list of {role, content}, a KTO label that is not true/false, a score or margin that
    is not a finite number."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: must be one of {', '.join(KINDS)}")
    if not train:
        raise ValueError(
            "dataset: no training rows; export a dataset from traces that match (widen the filter, lower"
            " min_reward / min_margin)"
        )
    if len(train) < min_samples:
        raise ValueError(
            f"dataset: {len(train)} training rows, at least {min_samples} are needed; collect more traces or"
            " lower the export's validation_fraction"
        )
    columns = set(train[0])
    _kind_module(kind).check_columns(columns)
    for split, rows in (("train", train), ("validation", validation)):
        for i, row in enumerate(rows):
            _check_row(kind, row, columns, f"dataset: {split} row {i}")
    if kind == "reward_model" and "chosen" not in columns:
        # Scored rows become pairs within each prompt; refuse rows that make none.
        _kind_module(kind).pairs_from_scores(train)
    return _warnings(kind, train, validation)


def check_reward_columns(rewards: Iterable[Any], train: list[dict[str, Any]], validation: list[dict[str, Any]]) -> None:
    """The columns a job's reward sources read (``RewardSourceDesc``s): an information-gain
    source's outcome column must hold non-empty text in every row of both splits. Raises
    Invalid naming the source's field (``spec.rewards[0].information_gain.outcome_column``),
    the split and the row."""
    from flywheel.core.validation import Invalid

    for source in rewards:
        column = getattr(source, "outcome_column", "")
        if not column:
            continue
        where = f"{source.request_field or 'spec.rewards'}.information_gain.outcome_column"
        for split, rows in (("train", train), ("validation", validation)):
            for i, row in enumerate(rows):
                if column not in row:
                    have = ", ".join(sorted(row)) or "none"
                    raise Invalid(where, f"dataset {split} row {i} has no {column!r} column (columns: {have})")
                value = row[column]
                if not isinstance(value, str):
                    got = type(value).__name__
                    raise Invalid(where, f"dataset {split} row {i}: {column!r} must be text, got {got}")
                if not value.strip():
                    raise Invalid(where, f"dataset {split} row {i}: {column!r} is empty (the observed outcome)")


def _kind_module(kind: str) -> Any:
    import importlib

    return importlib.import_module(f"flywheel.trainer.training.{kind}")


def _check_row(kind: str, row: Any, columns: set[str], where: str) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a JSON object is expected, got {type(row).__name__}")
    if set(row) != columns:
        missing, extra = sorted(columns - set(row)), sorted(set(row) - columns)
        raise ValueError(f"{where}: columns differ from train row 0 (missing {missing}, extra {extra})")
    for column in TEXT_COLUMNS:
        if column in row:
            value = row[column]
            if not isinstance(value, str):
                raise ValueError(f"{where}: {column!r} must be a string, got {type(value).__name__}")
            if not value.strip():
                raise ValueError(f"{where}: {column!r} is empty")
    if "messages" in row:
        _check_messages(row["messages"], where)
    for column in NUMBER_COLUMNS:
        if column in row:
            value = row[column]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: {column!r} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{where}: {column!r} is {value} (scores must be finite numbers)")
    if kind == "kto" and not isinstance(row.get("label"), bool):
        label = row.get("label")
        raise ValueError(f"{where}: kto's 'label' must be true (desirable) or false (undesirable), got {label!r}")


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{role, content}}")
    for j, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise ValueError(f"{where}: messages[{j}] must be an object with a string 'role'")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"{where}: messages[{j}].content must be a string")


def _warnings(kind: str, train: list[dict[str, Any]], validation: list[dict[str, Any]]) -> list[str]:
    out = []
    if not validation:
        out.append("no validation rows: the held-out evaluation has nothing to score")
    if kind in ("dpo", "reward_model") and "chosen" in train[0]:
        same = sum(1 for r in train if r["chosen"] == r["rejected"])
        if same:
            out.append(f"{same} of {len(train)} training pairs have chosen == rejected (they teach nothing)")
    if kind == "kto":
        desirable = sum(1 for r in train if r["label"])
        if desirable in (0, len(train)):
            out.append(f"every kto label is {bool(desirable)}: KTO learns from both desirable and undesirable rows")
    scores = _values(train, "score")
    if kind == "reward_model" and "chosen" not in train[0] and scores and len(set(scores)) == 1:
        out.append(f"every score is {scores[0]}: no pairs can be formed from equal scores")
    return out


def _values(rows: Iterable[dict[str, Any]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if column in r]
