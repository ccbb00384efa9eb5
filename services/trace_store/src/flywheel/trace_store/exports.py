"""ExportDataset: select traces, build rows, write JSONL + manifest to S3, register the
dataset in PostgreSQL, then announce it with a ``DatasetExportedEvent``.

The manifest (``datasets/<kind>/<dataset_id>/manifest.json``) lists each file with its
row count and sha256, the filter and parameters used, and every source trace id.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as pb
from flywheel.api.traces.v1.events_pb2 import DatasetExportedEvent
from flywheel.core.bus.publisher import Publisher
from flywheel.core.errors import InvalidArgument
from flywheel.core.objects import ObjectStore
from flywheel.trace_store.datasets import Example, build_rows, split_by_prompt
from flywheel.trace_store.models import DatasetRow
from flywheel.trace_store.queries import TraceFilter, all_traces

PURPOSE = "datasets"
KIND_NAMES = {pb.DATASET_KIND_PREFERENCE: "preference", pb.DATASET_KIND_SFT: "sft", pb.DATASET_KIND_REWARD: "reward"}


@dataclass(frozen=True)
class ExportParams:
    kind: int
    validation_fraction: float = 0.1
    min_reward: float = 0.8
    min_margin: float = 0.0


@dataclass(frozen=True)
class ExportResult:
    dataset_id: str
    manifest_uri: str
    train_rows: int
    validation_rows: int
    source_traces: int


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


class Exporter:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        objects: ObjectStore,
        publisher: Publisher,
        catalogue: Catalogue,
    ) -> None:
        self._sessions = sessions
        self._objects = objects
        self._publisher = publisher
        self._catalogue = catalogue

    async def export(self, *, where: TraceFilter, params: ExportParams) -> ExportResult:
        """Build, store, register and announce one dataset."""
        kind = KIND_NAMES.get(params.kind)  # type: ignore[call-overload]
        if kind is None:
            raise InvalidArgument("kind must be DATASET_KIND_PREFERENCE, DATASET_KIND_SFT or DATASET_KIND_REWARD")
        if not 0 <= params.validation_fraction < 1:
            raise InvalidArgument("validation_fraction must be in [0, 1)")
        async with self._sessions() as session:
            traces = await all_traces(session, where=where)
        examples = [
            Example(trace_id=t.trace_id, prompt=t.task, response=t.response, reward=t.reward)
            for t in traces
            if t.reward is not None
        ]
        rows = build_rows(kind, examples, min_reward=params.min_reward, min_margin=params.min_margin)
        train, validation = split_by_prompt(rows, params.validation_fraction)
        if not train:
            raise InvalidArgument(
                f"no {kind} rows from {len(traces)} matching traces ({len(examples)} with a reward, a task and a"
                " response); widen the filter or lower min_reward / min_margin"
            )
        dataset_id = f"ds-{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:12]}"
        prefix = f"{kind}/{dataset_id}"
        files = []
        for split, split_rows in (("train", train), ("validation", validation)):
            data = _jsonl(split_rows)
            await self._objects.put_bytes(PURPOSE, f"{prefix}/{split}.jsonl", data, content_type="application/x-ndjson")
            files.append(
                {
                    "split": split,
                    "key": f"{prefix}/{split}.jsonl",
                    "rows": len(split_rows),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data),
                }
            )
        source_ids = sorted({tid for r in train + validation for tid in r["trace_ids"]})  # type: ignore[attr-defined]
        manifest = {
            "dataset_id": dataset_id,
            "kind": kind,
            "created_at": datetime.now(UTC).isoformat(),
            "format": "jsonl",
            "bucket": self._objects.bucket(PURPOSE),
            "files": files,
            "params": {**asdict(params), "kind": kind},
            "filter": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(where).items()},
            "split": "by prompt: no prompt is in both train and validation",
            "source_traces": source_ids,
        }
        manifest_uri = await self._objects.put_bytes(
            PURPOSE, f"{prefix}/manifest.json", json.dumps(manifest, indent=1).encode(), content_type="application/json"
        )
        async with self._sessions() as session:
            session.add(
                DatasetRow(
                    dataset_id=dataset_id,
                    kind=kind,
                    manifest_uri=manifest_uri,
                    train_rows=len(train),
                    validation_rows=len(validation),
                    source_traces=len(source_ids),
                    params=manifest["params"],
                )
            )
            await session.commit()
        event = DatasetExportedEvent(
            meta=EventMeta(event_id=dataset_id, source="trace_store"),
            dataset_id=dataset_id,
            kind=params.kind,  # type: ignore[arg-type]
            manifest_uri=manifest_uri,
            train_rows=len(train),
            validation_rows=len(validation),
        )
        event.meta.time.GetCurrentTime()
        await self._publisher.publish(self._catalogue.dataset_exported(kind), event)
        return ExportResult(dataset_id, manifest_uri, len(train), len(validation), len(source_ids))
