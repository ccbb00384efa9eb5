"""The durable write path: span batches -> segment objects in S3 + index rows in PostgreSQL.

One call writes any number of batches in one transaction:

1. refuse batches whose parent links make a cycle with spans already stored;
2. plan one segment per (day, agent) and insert every span's index row with a
   multi-row ``INSERT .. SELECT FROM unnest(..) ON CONFLICT DO NOTHING RETURNING``, so
   only spans never stored before come back (a redelivered span is counted once);
3. PUT the segments meanwhile, and delete again any that holds no new span;
4. fold the new spans into their ``traces`` rows with SQL increments, register the
   segments, and commit.

Only after the commit does the caller acknowledge (JetStream ack or gRPC response). A
crash before the commit leaves at most an unreferenced segment object, which the
retention sweep removes; nothing half-indexed is ever visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from flywheel.api.traces.v1.spans_pb2 import Span, SpanKind, SpanStatus
from flywheel.trace_store import segments as seg
from flywheel.trace_store.segments import SegmentStore
from flywheel.trace_store.spans import (
    RESPONSE_RANK,
    InvalidSpan,
    check_links,
    normalised_reward,
    span_times,
    to_record,
)

# A segment is read whole to serve one trace: keep it small enough for that.
MAX_SEGMENT_SPANS = 2000

_INSERT_SPANS = """
INSERT INTO spans (trace_id, span_id, parent_span_id, kind, agent, start_time, status, segment, line)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::text[], $6::timestamptz[],
                     $7::int2[], $8::text[], $9::int4[])
ON CONFLICT DO NOTHING
RETURNING trace_id, span_id
"""

_STORED_CHILDREN = """
SELECT DISTINCT s.trace_id FROM spans s
JOIN unnest($1::text[], $2::text[]) AS n(trace_id, span_id)
  ON s.trace_id = n.trace_id AND s.parent_span_id = n.span_id
"""

_TRACE_LINKS = "SELECT trace_id, span_id, parent_span_id FROM spans WHERE trace_id = ANY($1::text[])"

_INSERT_SEGMENTS = """
INSERT INTO segments (key, agent, day, spans, live_spans, bytes)
SELECT k, a, d, n, n, b FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[]) AS t(k, a, d, n, b)
"""

# Every SET expression sees the old row (traces.*), so the CASEs compare old with new.
_UPSERT_TRACES = """
INSERT INTO traces (trace_id, agent, user_id, endpoint, decision_id, start_time, end_time, span_count,
                    error_count, reward_sum, reward_count, task, task_time, response, response_rank, response_time)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
                     $7::timestamptz[], $8::int4[], $9::int4[], $10::float8[], $11::int4[], $12::text[],
                     $13::timestamptz[], $14::text[], $15::int2[], $16::timestamptz[])
ON CONFLICT (trace_id) DO UPDATE SET
  user_id = CASE WHEN traces.user_id = '' THEN EXCLUDED.user_id ELSE traces.user_id END,
  endpoint = CASE WHEN traces.endpoint = '' THEN EXCLUDED.endpoint ELSE traces.endpoint END,
  decision_id = CASE WHEN traces.decision_id = '' THEN EXCLUDED.decision_id ELSE traces.decision_id END,
  start_time = LEAST(traces.start_time, EXCLUDED.start_time),
  end_time = GREATEST(traces.end_time, EXCLUDED.end_time),
  span_count = traces.span_count + EXCLUDED.span_count,
  error_count = traces.error_count + EXCLUDED.error_count,
  reward_sum = traces.reward_sum + EXCLUDED.reward_sum,
  reward_count = traces.reward_count + EXCLUDED.reward_count,
  task = CASE WHEN EXCLUDED.task_time < coalesce(traces.task_time, 'infinity') THEN EXCLUDED.task ELSE traces.task END,
  task_time = LEAST(traces.task_time, EXCLUDED.task_time),
  response = CASE WHEN (EXCLUDED.response_rank, coalesce(EXCLUDED.response_time, '-infinity'))
                     > (traces.response_rank, coalesce(traces.response_time, '-infinity'))
                  THEN EXCLUDED.response ELSE traces.response END,
  response_time = CASE WHEN (EXCLUDED.response_rank, coalesce(EXCLUDED.response_time, '-infinity'))
                     > (traces.response_rank, coalesce(traces.response_time, '-infinity'))
                  THEN EXCLUDED.response_time ELSE traces.response_time END,
  response_rank = GREATEST(traces.response_rank, EXCLUDED.response_rank),
  updated_at = now()
"""


@dataclass(frozen=True)
class IngestResult:
    """What one batch changed: spans stored for the first time, and spans seen before."""

    stored: int
    duplicate: int


@dataclass
class _Trace:
    agent: str
    user_id: str = ""
    endpoint: str = ""
    decision_id: str = ""
    start: datetime | None = None
    end: datetime | None = None
    count: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    reward_count: int = 0
    task: str = ""
    task_time: datetime | None = None
    response: str = ""
    response_rank: int = 0
    response_time: datetime | None = None

    def add(self, span: Span, start: datetime, end: datetime) -> None:
        self.user_id = self.user_id or span.user_id
        self.endpoint = self.endpoint or span.endpoint
        self.decision_id = self.decision_id or span.decision_id
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)
        self.count += 1
        self.errors += span.status == SpanStatus.SPAN_STATUS_ERROR
        if span.kind == SpanKind.SPAN_KIND_REWARD:
            self.reward_sum += normalised_reward(span)
            self.reward_count += 1
        is_task = span.kind == SpanKind.SPAN_KIND_PROMPT or not span.parent_span_id  # a prompt, or the root
        if is_task and span.input and (self.task_time is None or start < self.task_time):
            self.task, self.task_time = span.input, start
        rank = RESPONSE_RANK.get(span.kind, 0)  # type: ignore[call-overload]
        if (
            rank
            and span.output
            and (rank, end) > (self.response_rank, self.response_time or datetime.min.replace(tzinfo=UTC))
        ):
            self.response, self.response_rank, self.response_time = span.output, rank, end


@dataclass
class _Segment:
    key: str
    agent: str
    day: str
    records: list[dict[str, object]] = field(default_factory=list)
    new: int = 0
    data: bytes = b""


class SpanWriter:
    """Writes validated span batches durably (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, segments: SegmentStore) -> None:
        self._engine = engine
        self._segments = segments

    async def write(self, batches: Sequence[Sequence[Span]]) -> list[IngestResult | InvalidSpan]:
        """Store the batches; a batch is either stored whole or refused with its reason."""
        async with self._engine.connect() as sa_conn:
            raw = await sa_conn.get_raw_connection()
            conn = raw.driver_connection
            async with conn.transaction():  # type: ignore[union-attr]
                outcomes = await self._check_links(conn, batches)
                accepted = [(i, b) for i, b in enumerate(batches) if outcomes[i] is None]
                counts = await self._store(conn, accepted)
        return [o if o is not None else counts[i] for i, o in enumerate(outcomes)]

    async def _check_links(self, conn, batches: Sequence[Sequence[Span]]) -> list[InvalidSpan | None]:  # type: ignore[no-untyped-def]
        """Each batch was checked alone when validated; what is left are cycles through
        spans already stored or through an earlier batch of this write (same trace)."""
        ids = [(s.trace_id, s.span_id) for b in batches for s in b]
        traces = [r[0] for r in await conn.fetch(_STORED_CHILDREN, [t for t, _ in ids], [s for _, s in ids])]
        known: dict[str, dict[str, str]] = {}
        if traces:
            for trace_id, span_id, parent in await conn.fetch(_TRACE_LINKS, traces):
                known.setdefault(trace_id, {})[span_id] = parent
        outcomes: list[InvalidSpan | None] = []
        for batch in batches:
            touched = {s.trace_id for s in batch}
            if known.keys() & touched:
                try:
                    known.update(check_links(batch, known))
                except InvalidSpan as exc:
                    outcomes.append(exc)
                    continue
            else:
                for s in batch:
                    known.setdefault(s.trace_id, {}).setdefault(s.span_id, s.parent_span_id)
            outcomes.append(None)
        return outcomes

    async def _store(self, conn, accepted: list[tuple[int, Sequence[Span]]]) -> dict[int, IngestResult]:  # type: ignore[no-untyped-def]
        segments: list[_Segment] = []
        current: dict[tuple[date, str], _Segment] = {}
        owner: dict[tuple[str, str], tuple[int, Span, _Segment, datetime, datetime]] = {}
        # The nine index columns, appended to directly (this loop runs once per span).
        trace_ids: list[str] = []
        span_ids: list[str] = []
        parents: list[str] = []
        kinds: list[int] = []
        agents: list[str] = []
        starts: list[datetime] = []
        statuses: list[int] = []
        segment_keys: list[str] = []
        lines: list[int] = []
        totals = {i: len(b) for i, b in accepted}
        for i, batch in accepted:
            for span in batch:
                key = (span.trace_id, span.span_id)
                if key in owner:  # the same span twice in this write: one row
                    continue
                start, end = times = span_times(span)
                day = start.date()
                segment = current.get((day, span.agent))
                if segment is None or len(segment.records) >= MAX_SEGMENT_SPANS:
                    segment = _Segment(seg.segment_key(start, span.agent), span.agent, day.isoformat())
                    current[(day, span.agent)] = segment
                    segments.append(segment)
                owner[key] = (i, span, segment, start, end)
                trace_ids.append(span.trace_id)
                span_ids.append(span.span_id)
                parents.append(span.parent_span_id)
                kinds.append(span.kind)
                agents.append(span.agent)
                starts.append(start)
                statuses.append(span.status)
                segment_keys.append(segment.key)
                lines.append(len(segment.records))
                segment.records.append(to_record(span, times))
        if not owner:
            return {}
        columns = (trace_ids, span_ids, parents, kinds, agents, starts, statuses, segment_keys, lines)
        # Encode and upload every segment while PostgreSQL inserts the index rows (the
        # upload and the insert overlap). A segment whose spans all prove to be stored
        # already (a redelivered batch) is deleted again: no index row names it.
        insert = asyncio.ensure_future(conn.fetch(_INSERT_SPANS, *columns))
        await asyncio.sleep(0)  # let the insert encode and send its query before encoding here
        for s in segments:
            s.data = seg.encode(s.records)
        puts = asyncio.gather(*(self._segments.put(s.key, s.data) for s in segments))
        try:
            new_keys = [(r[0], r[1]) for r in await insert]
        finally:
            # Even if the insert failed: a put left running would outlive the transaction.
            await asyncio.gather(puts, return_exceptions=True)
        await puts  # a failed upload fails the write (nothing committed, redelivered later)

        stored = dict.fromkeys(totals, 0)
        traces: dict[str, _Trace] = {}
        for key in new_keys:
            i, span, segment, start, end = owner[key]
            stored[i] += 1
            segment.new += 1
            traces.setdefault(span.trace_id, _Trace(agent=span.agent)).add(span, start, end)
        written = [s for s in segments if s.new]
        await asyncio.gather(*(self._segments.delete(s.key) for s in segments if not s.new))
        if written:
            await conn.execute(
                _INSERT_SEGMENTS,
                [s.key for s in written],
                [s.agent for s in written],
                [s.day for s in written],
                [s.new for s in written],
                [len(s.data) for s in written],
            )
        if traces:
            ids = list(traces)
            t = [traces[k] for k in ids]
            await conn.execute(
                _UPSERT_TRACES,
                ids,
                [x.agent for x in t],
                [x.user_id for x in t],
                [x.endpoint for x in t],
                [x.decision_id for x in t],
                [x.start for x in t],
                [x.end for x in t],
                [x.count for x in t],
                [x.errors for x in t],
                [x.reward_sum for x in t],
                [x.reward_count for x in t],
                [x.task for x in t],
                [x.task_time for x in t],
                [x.response for x in t],
                [x.response_rank for x in t],
                [x.response_time for x in t],
            )
        return {i: IngestResult(stored=stored[i], duplicate=totals[i] - stored[i]) for i in totals}
