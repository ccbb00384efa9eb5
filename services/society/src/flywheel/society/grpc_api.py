"""gRPC servicer of the society: GetStats, StartSaoRound, GetSaoRound, ListDatasets,
ImportDataset and ExportDataset. Every request is checked at the door; a refused value is
INVALID_ARGUMENT naming its field (``config.n_personas: ...``, ``jsonl: line 3: ...``)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.society.v1 import society_service_pb2 as pb
from flywheel.api.society.v1 import society_service_pb2_grpc as pb_grpc
from flywheel.api.subjects import subject_token
from flywheel.core.errors import AlreadyExists, FailedPrecondition, NotFound, Unavailable
from flywheel.core.validation import Invalid, check_string, struct_to_dict
from flywheel.society.models import SaoDatasetRow, SaoRoundRow
from flywheel.society.runsettings import RunSocietyError, choose_model
from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.dataset import DatasetImportError, SaoDataset
from flywheel.society.sao.diversity import measure
from flywheel.society.sao.service import DATASET_ID, DATASET_ID_RULE, SaoRounds, clean_json, new_dataset_id
from flywheel.society.settings import SocietySettings
from flywheel.society.stats import get_stats

MAX_ID = 64
MAX_LIST = 1000
MAX_CONFIG_BYTES = 64 * 1024


def _timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(clean_json(value))
    return out


def round_message(row: SaoRoundRow) -> pb.SaoRound:
    return pb.SaoRound(
        round_id=row.round_id,
        state=row.state,
        dataset_id=row.dataset_id,
        error=row.error or "",
        rounds=[_struct(r) for r in row.rounds or [] if isinstance(r, dict)],
        created_at=_timestamp(row.created_at),
        finished_at=_timestamp(row.finished_at),
    )


def dataset_message(row: SaoDatasetRow) -> pb.SaoDatasetInfo:
    return pb.SaoDatasetInfo(
        dataset_id=row.dataset_id,
        manifest_uri=row.manifest_uri,
        train_rows=row.train_rows,
        validation_rows=row.validation_rows,
        unique_prompts=row.unique_prompts,
        source=row.source,
        stats=_struct(row.stats or {}),
        training_job_id=row.training_job_id or "",
        run_id=row.run_id or "",
        created_at=_timestamp(row.created_at),
    )


def check_dataset_id(value: str, *, required: bool) -> str:
    """A dataset id (see DATASET_ID_RULE); empty and not required: a new generated one."""
    check_string(value, "dataset_id", max_len=128, required=required, what="a dataset id")
    if not value:
        return new_dataset_id()
    if not DATASET_ID.fullmatch(value):
        raise Invalid("dataset_id", f"must be {DATASET_ID_RULE} (it names a NATS subject and S3 keys)")
    return value


def parse_config(config: Struct, allowed_models: list[str]) -> tuple[SaoConfig, str]:
    """(SaoConfig, model) from a StartSaoRound config: SAOConfig fields plus ``model`` (one
    of the society's allowed models; absent: the default)."""
    fields = struct_to_dict(config, "config", max_bytes=MAX_CONFIG_BYTES)
    requested = fields.pop("model", "")
    if not isinstance(requested, str):
        raise Invalid("config.model", "must be a string")
    try:
        model = choose_model(requested, allowed_models)
    except RunSocietyError:
        raise Invalid("config.model", f"{requested!r} is not one of the models this society may call") from None
    try:
        return SaoConfig(**fields), model
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        raise Invalid(f"config.{where}", err["msg"]) from None


class SocietyServicer(pb_grpc.SocietyServiceServicer):
    def __init__(
        self,
        *,
        settings: SocietySettings,
        sessions: async_sessionmaker[AsyncSession],
        rounds: SaoRounds,
        objects: Any,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._rounds = rounds
        self._objects = objects

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:
        run_id = check_string(request.run_id, "run_id", max_len=MAX_ID)
        async with self._sessions() as session:
            return await get_stats(session, run_id=run_id)

    async def StartSaoRound(
        self, request: pb.StartSaoRoundRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartSaoRoundResponse:
        dataset_id = check_dataset_id(request.dataset_id, required=False)
        config, model = parse_config(request.config, self._settings.allowed_models())
        endpoint = check_string(request.endpoint, "endpoint", max_len=MAX_ID)
        if endpoint:
            try:
                subject_token(endpoint, what="endpoint")
            except ValueError:
                raise Invalid("endpoint", "must be 1-64 characters of [A-Za-z0-9_-] (an endpoint name)") from None
        if endpoint and (self._rounds.traces is None or not self._rounds.traces.configured):
            raise FailedPrecondition(
                "endpoint: the society has no trace store to read its prompts from "
                "(set FLYWHEEL_SOCIETY_TRACE_STORE_ADDRESS)"
            )
        if self._rounds.judge is None:
            raise FailedPrecondition(
                "the society has no reward judge to rank pairs with (set FLYWHEEL_SOCIETY_JUDGE_ADDRESS)"
            )
        row, created = await self._rounds.queue(
            dataset_id=dataset_id, config=config, model=model, endpoint=endpoint, train=request.train
        )
        if not created:
            raise AlreadyExists(f"dataset_id: {dataset_id!r} already has a round ({row.round_id})")
        return pb.StartSaoRoundResponse(round=round_message(row))

    async def GetSaoRound(
        self, request: pb.GetSaoRoundRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSaoRoundResponse:
        round_id = check_string(request.round_id, "round_id", max_len=MAX_ID, required=True, what="a round id")
        row = await self._rounds.get(round_id)
        if row is None:
            raise NotFound(f"round_id: no SAO round {round_id!r}")
        return pb.GetSaoRoundResponse(round=round_message(row))

    async def ListDatasets(
        self, request: pb.ListDatasetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDatasetsResponse:
        if not 0 <= request.limit <= MAX_LIST:
            raise Invalid("limit", f"must be in [0, {MAX_LIST}] (0 means 100), got {request.limit}")
        async with self._sessions() as session:
            rows = await session.scalars(
                select(SaoDatasetRow)
                .order_by(SaoDatasetRow.created_at.desc(), SaoDatasetRow.dataset_id)
                .limit(request.limit or 100)
            )
            return pb.ListDatasetsResponse(datasets=[dataset_message(r) for r in rows])

    async def ImportDataset(
        self, request: pb.ImportDatasetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ImportDatasetResponse:
        dataset_id = check_dataset_id(request.dataset_id, required=False)
        limit = self._settings.import_max_bytes
        if len(request.jsonl) > limit:
            raise Invalid("jsonl", f"is {len(request.jsonl)} bytes, more than {limit}")
        try:
            text = request.jsonl.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = request.jsonl[: exc.start].count(b"\n") + 1
            raise Invalid("jsonl", f"line {line}: is not valid UTF-8") from None
        try:  # parsing and MinHash are CPU work: off the event loop
            dataset = await asyncio.to_thread(SaoDataset.from_jsonl, text)
        except DatasetImportError as exc:
            raise Invalid("jsonl", str(exc)) from None
        if not dataset.records:
            raise Invalid("jsonl", "holds no records")
        diversity = await asyncio.to_thread(measure, dataset.prompts())
        stats = {
            "records": len(dataset),
            "unique_prompts": diversity.unique_prompts,
            "prompt_repetition_rate": diversity.repetition_rate,
        }
        row = await self._rounds.register(
            dataset, dataset_id=dataset_id, source="import", stats=stats, train=request.train
        )
        return pb.ImportDatasetResponse(dataset=dataset_message(row))

    async def ExportDataset(
        self, request: pb.ExportDatasetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExportDatasetResponse:
        dataset_id = check_dataset_id(request.dataset_id, required=True)
        async with self._sessions() as session:
            row = await session.get(SaoDatasetRow, dataset_id)
        if row is None:
            raise NotFound(f"dataset_id: no dataset {dataset_id!r}")
        return pb.ExportDatasetResponse(jsonl=await self._read_records(row))

    async def _read_records(self, row: SaoDatasetRow) -> bytes:
        """The dataset's train then validation JSONL, as its manifest lists them."""
        bucket, _, key = row.manifest_uri.removeprefix("s3://").partition("/")
        try:
            manifest = json.loads(await self._objects.get_object(bucket, key))
            files = sorted(manifest["files"], key=lambda f: 0 if f.get("split") == "train" else 1)
            parts = [await self._objects.get_object(manifest.get("bucket", bucket), f["key"]) for f in files]
        except FileNotFoundError:
            raise NotFound(f"dataset_id: {row.dataset_id!r} is registered but its files are gone from S3") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise Unavailable(f"dataset {row.dataset_id!r}: its manifest cannot be read ({exc})") from None
        return b"".join(parts)
