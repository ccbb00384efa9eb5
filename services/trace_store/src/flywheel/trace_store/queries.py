"""Reading traces back: one trace as a tree (``get_trace``) and filtered pages of trace
summaries (``query_traces``). Summaries come from the ``traces`` table joined with the
decision log and feedback; spans come from their segments."""

from __future__ import annotations

import base64
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.api.traces.v1.spans_pb2 import Span, SpanStatus
from flywheel.core.errors import InvalidArgument, NotFound
from flywheel.trace_store.segments import SegmentStore
from flywheel.trace_store.spans import TRACE_ID, from_record

MAX_PAGE = 1000
DEFAULT_PAGE = 100

# The trace's reward: the mean of its normalised reward spans, else its decision's feedback.
_SUMMARY = """
SELECT t.trace_id, t.agent, t.user_id, t.decision_id, t.start_time, t.end_time, t.span_count, t.error_count,
       t.task, t.response,
       coalesce(nullif(t.endpoint, ''), d.endpoint, '') AS endpoint,
       coalesce(t.reward_sum / nullif(t.reward_count, 0), fb.reward) AS reward
FROM traces t
LEFT JOIN decision_log d ON d.decision_id = t.decision_id AND t.decision_id <> ''
LEFT JOIN LATERAL (
  SELECT f.reward FROM feedback_log f
  WHERE t.decision_id <> '' AND f.decision_id = t.decision_id AND f.reward IS NOT NULL
  ORDER BY f.sent_at DESC LIMIT 1
) fb ON true
"""


@dataclass(frozen=True)
class TraceFilter:
    """Which traces a query or an export covers; empty fields match everything."""

    agent: str = ""
    start_after: datetime | None = None
    start_before: datetime | None = None
    endpoint: str = ""
    decision_id: str = ""
    min_reward: float | None = None
    max_reward: float | None = None
    text: str = ""
    status: int = SpanStatus.SPAN_STATUS_UNSPECIFIED


def _where(f: TraceFilter) -> tuple[list[str], dict[str, Any]]:
    for name in ("min_reward", "max_reward"):
        value = getattr(f, name)
        if value is not None and not math.isfinite(value):
            raise InvalidArgument(f"{name} must be a finite number")
    if f.min_reward is not None and f.max_reward is not None and f.min_reward > f.max_reward:
        raise InvalidArgument("min_reward is larger than max_reward")
    if f.start_after and f.start_before and f.start_after >= f.start_before:
        raise InvalidArgument("start_after must be before start_before")
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if f.agent:
        clauses.append("t.agent = :agent")
        params["agent"] = f.agent
    if f.start_after:
        clauses.append("t.start_time > :start_after")
        params["start_after"] = f.start_after
    if f.start_before:
        clauses.append("t.start_time < :start_before")
        params["start_before"] = f.start_before
    if f.endpoint:
        clauses.append("coalesce(nullif(t.endpoint, ''), d.endpoint, '') = :endpoint")
        params["endpoint"] = f.endpoint
    if f.decision_id:
        clauses.append("t.decision_id = :decision_id")
        params["decision_id"] = f.decision_id
    reward = "coalesce(t.reward_sum / nullif(t.reward_count, 0), fb.reward)"
    if f.min_reward is not None:
        clauses.append(f"{reward} >= :min_reward")
        params["min_reward"] = f.min_reward
    if f.max_reward is not None:
        clauses.append(f"{reward} <= :max_reward")
        params["max_reward"] = f.max_reward
    if f.text:
        # LIKE on lower(task) is what the trigram index (migration 0003) serves; the text is
        # matched literally, so its own % and _ are escaped.
        clauses.append("lower(t.task) LIKE '%' || lower(:text) || '%' ESCAPE '\\'")
        params["text"] = f.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    if f.status == SpanStatus.SPAN_STATUS_ERROR:
        clauses.append("t.error_count > 0")
    elif f.status == SpanStatus.SPAN_STATUS_OK:
        clauses.append("t.error_count = 0")
    elif f.status != SpanStatus.SPAN_STATUS_UNSPECIFIED:
        raise InvalidArgument(f"unknown status {f.status}")
    return clauses, params


def _token(row: Any) -> str:
    return base64.urlsafe_b64encode(f"{row.start_time.isoformat()}|{row.trace_id}".encode()).decode()


def _untoken(token: str) -> tuple[datetime, str]:
    try:
        when, trace_id = base64.urlsafe_b64decode(token.encode()).decode().split("|")
        if not re.fullmatch(r"[0-9a-f]{32}", trace_id):  # it goes into SQL as a trace id
            raise ValueError(trace_id)
        return datetime.fromisoformat(when), trace_id
    except Exception:  # noqa: BLE001 - any garbage is the same mistake
        raise InvalidArgument("page_token is not one this server returned; start again without it") from None


async def query_traces(
    session: AsyncSession, *, where: TraceFilter, page_size: int = 0, page_token: str = ""
) -> tuple[list[Any], str]:
    """One page of trace summaries, newest first, and the token of the next page ('' at the end)."""
    if page_size < 0:
        raise InvalidArgument("page_size must be >= 0")
    size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
    clauses, params = _where(where)
    if page_token:
        params["after_time"], params["after_id"] = _untoken(page_token)
        clauses.append("(t.start_time, t.trace_id) < (:after_time, :after_id)")
    sql = _SUMMARY + (" WHERE " + " AND ".join(clauses) if clauses else "")
    sql += " ORDER BY t.start_time DESC, t.trace_id DESC LIMIT :limit"
    params["limit"] = size + 1
    rows = (await session.execute(text(sql), params)).all()
    more = len(rows) > size
    rows = rows[:size]
    return rows, _token(rows[-1]) if more and rows else ""


async def all_traces(session: AsyncSession, *, where: TraceFilter) -> list[Any]:
    """Every trace summary matching the filter (for exports)."""
    clauses, params = _where(where)
    sql = _SUMMARY + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY t.trace_id"
    return list((await session.execute(text(sql), params)).all())


async def trace_summary(session: AsyncSession, *, trace_id: str) -> Any:
    if not TRACE_ID.fullmatch(trace_id):
        raise InvalidArgument("trace_id must be 32 lowercase hex chars")
    row = (await session.execute(text(_SUMMARY + " WHERE t.trace_id = :id"), {"id": trace_id})).first()
    if row is None:
        raise NotFound(f"trace {trace_id} is not stored")
    return row


async def get_trace(
    session: AsyncSession, segments: SegmentStore, *, trace_id: str
) -> tuple[Any, list[tuple[Span, int]]]:
    """The trace's summary and its spans as a tree: depth first, children after their
    parent in start order, each with its depth."""
    summary = await trace_summary(session, trace_id=trace_id)
    rows = (await session.execute(text("SELECT segment, line FROM spans WHERE trace_id = :id"), {"id": trace_id})).all()
    by_segment: dict[str, list[int]] = defaultdict(list)
    for segment, line in rows:
        by_segment[segment].append(line)
    spans: list[Span] = []
    for segment, lines in by_segment.items():
        content = await segments.read(segment)
        for line in lines:
            record = content[line]
            if record is not None:
                spans.append(from_record(record))
    return summary, tree_order(spans)


def tree_order(spans: list[Span]) -> list[tuple[Span, int]]:
    """Depth-first order with depths; spans whose parent is absent are roots."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = defaultdict(list)
    roots: list[Span] = []
    for s in spans:
        (children[s.parent_span_id] if s.parent_span_id in ids else roots).append(s)

    def key(s: Span) -> tuple[int, int, str]:
        return s.start_time.seconds, s.start_time.nanos, s.span_id

    out: list[tuple[Span, int]] = []
    stack = [(s, 0) for s in sorted(roots, key=key, reverse=True)]
    while stack:
        span, depth = stack.pop()
        out.append((span, depth))
        stack.extend((c, depth + 1) for c in sorted(children[span.span_id], key=key, reverse=True))
    return out
