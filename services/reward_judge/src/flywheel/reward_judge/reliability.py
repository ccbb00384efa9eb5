"""How far each judge can be trusted: fallback rate, agreement between the two orders
of a pair, and rank agreement (Spearman, Kendall) with human scores where given.

Counters live in PostgreSQL (``judge_stats``, changed by SQL increments only) so the
figures cover every replica; they are also exported as Prometheus gauges."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.reward_judge.metrics import FALLBACK_RATE, HUMAN_KENDALL, HUMAN_SPEARMAN, JUDGEMENTS, SWAP_AGREEMENT
from flywheel.reward_judge.models import HumanLabelRow, JudgeStatsRow

MIN_LABELS = 3
MAX_LABELS = 10_000  # the most recent labels used for the correlations


@dataclass(frozen=True)
class Reliability:
    judge_id: str
    judgements: int
    fallbacks: int
    swap_pairs: int
    swap_agree: int
    human_labels: int
    spearman: float
    kendall: float

    @property
    def fallback_rate(self) -> float:
        return self.fallbacks / self.judgements if self.judgements else 0.0

    @property
    def swap_agreement(self) -> float:
        return self.swap_agree / self.swap_pairs if self.swap_pairs else math.nan


def correlations(judge: list[float], human: list[float]) -> tuple[float, float]:
    """Spearman's rho and Kendall's tau-b; NaN with fewer than three pairs or no variance."""
    if len(judge) < MIN_LABELS or len(set(judge)) < 2 or len(set(human)) < 2:
        return math.nan, math.nan
    from scipy.stats import kendalltau, spearmanr

    rho = float(spearmanr(judge, human).statistic)
    tau = float(kendalltau(judge, human).statistic)
    return rho, tau


def export(r: Reliability) -> Reliability:
    """Update the Prometheus gauges from one judge's figures."""
    FALLBACK_RATE.labels(r.judge_id).set(r.fallback_rate)
    if r.swap_pairs:
        SWAP_AGREEMENT.labels(r.judge_id).set(r.swap_agreement)
    if not math.isnan(r.spearman):
        HUMAN_SPEARMAN.labels(r.judge_id).set(r.spearman)
        HUMAN_KENDALL.labels(r.judge_id).set(r.kendall)
    return r


class StatsSink(Protocol):
    async def record(self, judge_id: str, *, fallback: bool, swap_pairs: int = 0, swap_agree: int = 0) -> None: ...
    async def record_human(self, judge_id: str, judge_score: float, human_score: float) -> None: ...
    async def figures(self, judge_id: str = "") -> list[Reliability]: ...


class MemoryStats:
    """Per-process figures (tests, the calibration script)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self._labels: dict[str, list[tuple[float, float]]] = defaultdict(list)

    async def record(self, judge_id: str, *, fallback: bool, swap_pairs: int = 0, swap_agree: int = 0) -> None:
        JUDGEMENTS.labels(judge_id, str(fallback).lower()).inc()
        c = self._counts[judge_id]
        c[0] += 1
        c[1] += int(fallback)
        c[2] += swap_pairs
        c[3] += swap_agree

    async def record_human(self, judge_id: str, judge_score: float, human_score: float) -> None:
        self._labels[judge_id].append((judge_score, human_score))

    async def figures(self, judge_id: str = "") -> list[Reliability]:
        ids = [judge_id] if judge_id else sorted(set(self._counts) | set(self._labels))
        out = []
        for j in ids:
            c = self._counts.get(j, [0, 0, 0, 0])
            labels = self._labels.get(j, [])[-MAX_LABELS:]
            rho, tau = correlations([a for a, _ in labels], [b for _, b in labels])
            out.append(export(Reliability(j, c[0], c[1], c[2], c[3], len(labels), rho, tau)))
        return out


_BUMP = text(
    "INSERT INTO judge_stats (judge_id, judgements, fallbacks, swap_pairs, swap_agree) "
    "VALUES (:j, 1, :f, :p, :a) ON CONFLICT (judge_id) DO UPDATE SET "
    "judgements = judge_stats.judgements + 1, fallbacks = judge_stats.fallbacks + EXCLUDED.fallbacks, "
    "swap_pairs = judge_stats.swap_pairs + EXCLUDED.swap_pairs, "
    "swap_agree = judge_stats.swap_agree + EXCLUDED.swap_agree"
)


class PostgresStats:
    """Figures shared by every replica."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def record(self, judge_id: str, *, fallback: bool, swap_pairs: int = 0, swap_agree: int = 0) -> None:
        JUDGEMENTS.labels(judge_id, str(fallback).lower()).inc()
        async with self._sessions() as s, s.begin():
            await s.execute(_BUMP, {"j": judge_id, "f": int(fallback), "p": swap_pairs, "a": swap_agree})

    async def record_human(self, judge_id: str, judge_score: float, human_score: float) -> None:
        async with self._sessions() as s, s.begin():
            s.add(HumanLabelRow(judge_id=judge_id, judge_score=judge_score, human_score=human_score))

    async def figures(self, judge_id: str = "") -> list[Reliability]:
        async with self._sessions() as s:
            q = select(JudgeStatsRow)
            if judge_id:
                q = q.where(JudgeStatsRow.judge_id == judge_id)
            stats = {r.judge_id: r for r in (await s.execute(q.order_by(JudgeStatsRow.judge_id))).scalars()}
            ids = [judge_id] if judge_id else sorted(stats)
            out = []
            for j in ids:
                rows = (
                    await s.execute(
                        select(HumanLabelRow.judge_score, HumanLabelRow.human_score)
                        .where(HumanLabelRow.judge_id == j)
                        .order_by(HumanLabelRow.id.desc())
                        .limit(MAX_LABELS)
                    )
                ).all()
                rho, tau = correlations([r[0] for r in rows], [r[1] for r in rows])
                st = stats.get(j)
                counts = (st.judgements, st.fallbacks, st.swap_pairs, st.swap_agree) if st else (0, 0, 0, 0)
                out.append(export(Reliability(j, *counts, len(rows), rho, tau)))
        return out
