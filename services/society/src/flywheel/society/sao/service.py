"""SAO rounds as a service: queue, run, register, announce, train.

A round is a row of ``sao_rounds`` (queued -> running -> succeeded | failed). Workers in
every replica claim queued rounds with ``FOR UPDATE SKIP LOCKED``; while a worker runs a
round it holds a PostgreSQL session advisory lock on the round's id, on a connection of its
own. A round found ``running`` whose lock nobody holds was left by a replica that died (its
connection closed and PostgreSQL released the lock): the sweep puts it back in the queue,
at most ``MAX_ATTEMPTS`` times.

A finished round's pairs become a dataset: written to S3 in the trace store's export format
(:meth:`SaoDataset.publish`), a ``sao_datasets`` row with the rounds' summary, a
``SaoDatasetEvent`` on ``society.dataset.<id>``, and, when asked and the dataset is large
enough, a preference job submitted to the trainer. Imports take the same path.

Public entry points: :class:`SaoRounds` (``queue``, ``start_for_run``, ``register``,
``work_forever``, ``sweep_forever``) and :func:`dataset_token`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.society.v1.events_pb2 import SaoDatasetEvent
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.errors import AlreadyExists
from flywheel.core.logging import get_logger
from flywheel.society import metrics
from flywheel.society.models import SaoDatasetRow, SaoRoundRow
from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.dataset import SaoDataset
from flywheel.society.sao.llm import Llm, Ranker
from flywheel.society.sao.round import RoundResult, run_rounds
from flywheel.society.settings import SocietySettings
from flywheel.society.stats import summarize_rounds

log = get_logger(__name__)

# A dataset id is one NATS subject token (its SaoDatasetEvent's subject) and an S3 key part.
DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
DATASET_ID_RULE = "1-64 characters of [A-Za-z0-9_-], starting with a letter or digit"
QUEUED, RUNNING, SUCCEEDED, FAILED = "queued", "running", "succeeded", "failed"
# A round whose replica died this many times is failed instead of queued again.
MAX_ATTEMPTS = 3
SOURCE = "society"
POLICY_NAME = "sao-policy"


def round_id_for(dataset_id: str) -> str:
    """The round that fills ``dataset_id``: one per dataset, so queueing twice is a no-op."""
    return "sao-" + hashlib.sha256(dataset_id.encode()).hexdigest()[:24]


def new_dataset_id() -> str:
    return f"sao-{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:12]}"


def dataset_token(name: str) -> str:
    """``name`` made a valid dataset id, deterministically (a run's ``sao-<run>-g<gen>``):
    other characters become '-', and a name too long keeps its head plus a hash of the whole."""
    token = re.sub(r"[^A-Za-z0-9_-]", "-", name).lstrip("-_") or "sao"
    if len(token) > 64:
        token = f"{token[:51]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return token


def _lock_key(round_id: str) -> str:
    return f"flywheel.society.sao.{round_id}"


async def _release(conn: AsyncConnection, round_id: str) -> None:
    """Unlock the round and give the connection back; if the unlock fails, the connection is
    closed for good (a pooled connection would keep the session lock, and the round would look
    alive forever)."""
    try:
        await conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": _lock_key(round_id)})
        await conn.commit()
    except BaseException:
        with contextlib.suppress(BaseException):
            await conn.invalidate()
        raise
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


def _rowcount(result: Any) -> int:
    """Rows an UPDATE/INSERT touched (a CursorResult's; typed as a plain Result)."""
    return int(getattr(result, "rowcount", 0) or 0)


def clean_json(value: Any) -> Any:
    """NaN and infinity as null (PostgreSQL's JSON has neither), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


class SaoRounds:
    """Queues and runs SAO rounds and registers datasets (see the module docstring).

    ``llm_for(model)`` gives the policy model for a round's chosen model name; ``judge`` is
    the reward judge (None: rounds cannot run, StartSaoRound says so); ``trainer`` a
    :class:`flywheel.society.clients.TrainerJobs` (None or unconfigured: no training)."""

    def __init__(
        self,
        *,
        settings: SocietySettings,
        engine: AsyncEngine,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Any,
        catalogue: Any,
        objects: Any,
        llm_for: Callable[[str], Awaitable[Llm]],
        judge: Ranker | None,
        trainer: Any = None,
        traces: Any = None,
        poll_s: float = 2.0,
        sweep_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._sessions = sessions
        self._publisher = publisher
        self._catalogue = catalogue
        self._objects = objects
        self._llm_for = llm_for
        self.judge = judge
        self._trainer = trainer
        self.traces = traces
        self._poll_s = poll_s
        self._sweep_s = sweep_s
        self._wake = asyncio.Event()

    # --- queueing ------------------------------------------------------------------------------

    async def queue(
        self,
        *,
        dataset_id: str,
        config: SaoConfig,
        model: str,
        endpoint: str = "",
        train: bool = False,
        run_id: str = "",
    ) -> tuple[SaoRoundRow, bool]:
        """Queue the round that fills ``dataset_id``; (its row, whether it is new). A dataset
        id that is already registered, or already has a round, gives the existing round back
        with ``False``."""
        round_id = round_id_for(dataset_id)
        request = {
            "config": config.model_dump(mode="json"),
            "model": model,
            "endpoint": endpoint,
            "train": train,
            "attempts": 0,
        }
        async with self._sessions() as session:
            if await session.get(SaoDatasetRow, dataset_id) is not None:
                existing = await session.get(SaoRoundRow, round_id)
                if existing is not None:
                    return existing, False
                raise AlreadyExists(f"dataset_id: {dataset_id!r} is already registered")
            stmt = (
                insert(SaoRoundRow)
                .values(
                    round_id=round_id,
                    state=QUEUED,
                    dataset_id=dataset_id,
                    run_id=run_id,
                    request=clean_json(request),
                    rounds=[],
                    error="",
                )
                .on_conflict_do_nothing(index_elements=["round_id"])
            )
            created = _rowcount(await session.execute(stmt)) == 1
            await session.commit()
            row = await session.get(SaoRoundRow, round_id)
        assert row is not None
        if created:
            metrics.SAO_ROUNDS.labels(state=QUEUED).inc()
            self._wake.set()
        return row, created

    async def start_for_run(self, *, run_id: str, config: SaoConfig, model: str, dataset_id: str) -> str:
        """Queue a run's SAO round (RLP's hook) and return its round id; the same dataset id
        gives the same round (a redelivered progress event queues nothing more). The id is
        made a valid dataset id first (:func:`dataset_token`)."""
        row, _ = await self.queue(
            dataset_id=dataset_token(dataset_id),
            config=config,
            model=model,
            train=True,
            run_id=run_id,
        )
        return row.round_id

    async def get(self, round_id: str) -> SaoRoundRow | None:
        async with self._sessions() as session:
            return await session.get(SaoRoundRow, round_id)

    # --- workers -------------------------------------------------------------------------------

    async def work_forever(self) -> None:
        """One worker: claim a queued round, run it, repeat; idle, wait for a new round or
        ``poll_s``. Never raises (a failure is the round's, or logged and retried)."""
        while True:
            try:
                claimed = await self._claim()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL away: try again shortly
                log.warning("sao claim failed", error=repr(exc))
                claimed = None
            if claimed is None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll_s)
                continue
            conn, round_id = claimed
            try:
                await self.run(round_id)
            finally:
                await _release(conn, round_id)

    async def _claim(self) -> tuple[AsyncConnection, str] | None:
        """The oldest queued round, now running, with its lock held on the returned
        connection (kept open while the round runs)."""
        conn = await self._engine.connect()
        try:
            found = (
                await conn.execute(
                    text(
                        "SELECT round_id, request FROM sao_rounds WHERE state = 'queued' "
                        "ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
                    )
                )
            ).first()
            if found is None:
                await conn.rollback()
                await conn.close()
                return None
            round_id, request = found
            got = await conn.scalar(text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": _lock_key(round_id)})
            if not got:  # the sweep is looking at it this instant; next time
                await conn.rollback()
                await conn.close()
                return None
            request = {**(request or {}), "attempts": int((request or {}).get("attempts", 0)) + 1}
            await conn.execute(
                update(SaoRoundRow).where(SaoRoundRow.round_id == round_id).values(state=RUNNING, request=request)
            )
            await conn.commit()  # the session lock outlives the transaction
        except BaseException:
            with contextlib.suppress(BaseException):
                await conn.invalidate()  # it may hold the lock: never back to the pool
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        return conn, round_id

    async def sweep_forever(self) -> None:
        """Put back in the queue the rounds a dead replica left running (every ``sweep_s``)."""
        while True:
            try:
                await self.requeue_orphans()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL away: next time
                log.warning("sao sweep failed", error=repr(exc))
            await asyncio.sleep(self._sweep_s)

    async def requeue_orphans(self) -> int:
        """Rounds ``running`` with nobody holding their lock: queued again (failed after
        ``MAX_ATTEMPTS`` pick-ups). Returns how many were queued again."""
        requeued = 0
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(SaoRoundRow.round_id).where(SaoRoundRow.state == RUNNING))).all()
            await conn.commit()
            for (round_id,) in rows:
                key = {"k": _lock_key(round_id)}
                if not await conn.scalar(text("SELECT pg_try_advisory_lock(hashtext(:k))"), key):
                    await conn.commit()
                    continue  # a live worker holds it
                try:
                    row = await conn.execute(select(SaoRoundRow.request).where(SaoRoundRow.round_id == round_id))
                    request = row.scalar_one_or_none() or {}
                    attempts = int(request.get("attempts", 0))
                    values: dict[str, Any] = {"state": QUEUED}
                    if attempts >= MAX_ATTEMPTS:
                        values = {
                            "state": FAILED,
                            "error": f"the replica running it stopped {attempts} times; not tried again",
                            "finished_at": datetime.now(UTC),
                        }
                    done = await conn.execute(
                        update(SaoRoundRow)
                        .where(SaoRoundRow.round_id == round_id, SaoRoundRow.state == RUNNING)
                        .values(**values)
                    )
                    await conn.commit()
                    if _rowcount(done) and values["state"] == QUEUED:
                        requeued += 1
                        log.info("sao round queued again", round_id=round_id, attempts=attempts)
                finally:
                    try:
                        await conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), key)
                        await conn.commit()
                    except BaseException:
                        with contextlib.suppress(BaseException):
                            await conn.invalidate()  # never back to the pool holding the lock
                        raise
        if requeued:
            self._wake.set()
        return requeued

    # --- running a round -----------------------------------------------------------------------

    async def run(self, round_id: str) -> None:
        """Run a claimed round to its end; a failure is recorded on the round, never raised."""
        row = await self.get(round_id)
        if row is None:
            return
        started = asyncio.get_running_loop().time()
        try:
            await self._run(row)
        except asyncio.CancelledError:
            raise  # stopping: the round stays running and the sweep queues it again
        except Exception as exc:  # noqa: BLE001 - the round fails, the worker goes on
            log.warning("sao round failed", round_id=round_id, error=repr(exc))
            await self._finish(round_id, FAILED, error=f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            metrics.SAO_ROUND_SECONDS.observe(asyncio.get_running_loop().time() - started)

    async def _run(self, row: SaoRoundRow) -> None:
        request = row.request or {}
        config = SaoConfig(**request.get("config", {}))
        if self.judge is None:
            raise RuntimeError("no reward judge configured (set FLYWHEEL_SOCIETY_JUDGE_ADDRESS)")
        llm = await self._llm_for(str(request.get("model", "")))
        per_round: list[dict[str, Any]] = []

        async def on_round(result: RoundResult) -> None:
            s = result.stats
            per_round.append(clean_json(s.to_dict()))
            metrics.record_round(s)
            async with self._sessions() as session:
                await session.execute(
                    update(SaoRoundRow).where(SaoRoundRow.round_id == row.round_id).values(rounds=per_round)
                )
                await session.commit()

        trace_prompts: list[str] = []
        endpoint = str(request.get("endpoint", ""))
        if endpoint:  # mixed into the first round, up to one per persona
            if self.traces is None or not self.traces.configured:
                raise RuntimeError("no trace store to read the endpoint's prompts from (set TRACE_STORE_ADDRESS)")
            trace_prompts = await self.traces.fetch(endpoint, config.n_personas)
        dataset, stats = await run_rounds(
            config, llm=llm, judge=self.judge, trace_prompts=trace_prompts, on_round=on_round
        )
        summary = summarize_rounds([s.to_dict() for s in stats])
        if endpoint:
            summary["endpoint"] = endpoint
            summary["trace_prompts"] = len(trace_prompts)
        if not dataset.records:
            dropped = ", ".join(f"{k} {v}" for k, v in summary["dropped"].items()) or "nothing attempted"
            raise RuntimeError(f"no pair was kept in {len(stats)} round(s) (dropped: {dropped})")
        await self.register(
            dataset,
            dataset_id=row.dataset_id,
            source="sao",
            run_id=row.run_id,
            stats={**summary, "round_id": row.round_id, "model": request.get("model", "")},
            params=config.model_dump(mode="json"),
            train=bool(request.get("train")),
            validation_fraction=config.validation_fraction,
        )
        await self._finish(row.round_id, SUCCEEDED)

    async def _finish(self, round_id: str, state: str, *, error: str = "") -> None:
        async with self._sessions() as session:
            done = await session.execute(
                update(SaoRoundRow)
                .where(SaoRoundRow.round_id == round_id, SaoRoundRow.state != SUCCEEDED)
                .values(state=state, error=error, finished_at=datetime.now(UTC))
            )
            await session.commit()
        if _rowcount(done):
            metrics.SAO_ROUNDS.labels(state=state).inc()

    # --- registering a dataset -----------------------------------------------------------------

    async def register(
        self,
        dataset: SaoDataset,
        *,
        dataset_id: str,
        source: str,
        stats: dict[str, Any],
        params: dict[str, Any] | None = None,
        run_id: str = "",
        train: bool = False,
        validation_fraction: float = 0.1,
    ) -> SaoDatasetRow:
        """Publish ``dataset`` to S3, record it, submit its preference job when it is large
        enough and ``train`` is asked, and announce it. AlreadyExists if the id is taken."""
        async with self._sessions() as session:
            if await session.get(SaoDatasetRow, dataset_id) is not None:
                raise AlreadyExists(f"dataset_id: {dataset_id!r} is already registered")
        published = await dataset.publish(
            self._objects,
            validation_fraction=validation_fraction,
            params=params,
            stats=clean_json(stats),
            dataset_id=dataset_id,
        )
        job_id, training = await self._maybe_train(published.manifest_uri, published.train_rows, train)
        row = SaoDatasetRow(
            dataset_id=dataset_id,
            manifest_uri=published.manifest_uri,
            train_rows=published.train_rows,
            validation_rows=published.validation_rows,
            unique_prompts=published.unique_prompts,
            source=source,
            stats=clean_json({**stats, "training": training}),
            training_job_id=job_id,
            run_id=run_id,
        )
        async with self._sessions() as session:
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                raise AlreadyExists(f"dataset_id: {dataset_id!r} is already registered") from None
            await session.refresh(row)
        metrics.SAO_DATASETS.labels(source=source).inc()
        await self._announce(row)
        return row

    async def _maybe_train(self, manifest_uri: str, train_rows: int, train: bool) -> tuple[str, str]:
        """(job id or "", what happened, in words)."""
        s = self._settings
        if not train:
            return "", "not requested"
        if train_rows < s.sao_train_threshold:
            return "", (
                f"{train_rows} training pairs, below the threshold of {s.sao_train_threshold} "
                f"({type(s).env_var('sao_train_threshold')})"
            )
        if not s.sao_train_base_model:
            return "", f"no base model to train (set {type(s).env_var('sao_train_base_model')})"
        if self._trainer is None or not self._trainer.configured:
            return "", f"no trainer configured (set {type(s).env_var('trainer_address')})"
        # The trainer offers DPO; SimPO (the paper's choice) is not among its kinds.
        note = "dpo" if s.sao_train_kind == "dpo" else "dpo (simpo asked; the trainer offers dpo only)"
        spec = jobs_pb2.TrainingJobSpec(
            kind=jobs_pb2.TRAINING_KIND_DPO,
            base_model=s.sao_train_base_model,
            dataset_uri=manifest_uri,
            policy_name=POLICY_NAME,
        )
        try:
            got = await self._trainer.submit(spec)
        except Exception as exc:  # noqa: BLE001 - the dataset stays registered; say why no job
            log.warning("sao training not submitted", error=repr(exc))
            return "", f"submitting the {note} job failed: {exc}"[:500]
        metrics.SAO_TRAINING_JOBS.inc()
        return got.job.job_id, f"{note} job {got.job.job_id} submitted"

    async def _announce(self, row: SaoDatasetRow) -> None:
        event = SaoDatasetEvent(
            meta=EventMeta(event_id=row.dataset_id, source=SOURCE),
            dataset_id=row.dataset_id,
            manifest_uri=row.manifest_uri,
            train_rows=row.train_rows,
            validation_rows=row.validation_rows,
            unique_prompts=row.unique_prompts,
            training_job_id=row.training_job_id,
        )
        subject = self._catalogue.society_dataset(row.dataset_id)
        for attempt in range(3):
            try:
                await self._publisher.publish(subject, event, msg_id=row.dataset_id)
                return
            except Exception as exc:  # noqa: BLE001 - NATS away: a few tries, then logged
                if attempt == 2:
                    log.warning("sao dataset event not published", dataset_id=row.dataset_id, error=repr(exc))
                    metrics.SAO_EVENTS_LOST.inc()
                    return
                await asyncio.sleep(0.5 * 2**attempt)
