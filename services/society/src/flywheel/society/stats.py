"""GetStats: SAO's figures from ``sao_datasets`` and ``sao_rounds``, RLP's from
``flywheel.society.rlp.stats``, in one GetStatsResponse.

SAO figures, over every SAO round recorded (rounds older than the retention go with their rows):

- ``datasets``, ``pairs`` (train + validation rows), ``unique_prompts``: registered datasets,
  imports included;
- ``rounds``: iterative rounds run (a queued round with ``iterative_rounds: 3`` counts 3);
- ``prompt_repetition_rate``: repeated prompts over prompts written (the paper's diversity
  figure), ``order_agreement_rate``: pairs whose two judge orders agreed over pairs judged in
  both orders, ``dropped_fraction``: pairs dropped for each reason over pairs attempted."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from flywheel.api.society.v1 import society_service_pb2 as pb
from flywheel.society.models import SaoDatasetRow, SaoRoundRow
from flywheel.society.rlp.stats import rlp_stats

# Round records read for the SAO figures (the newest first).
MAX_ROUNDS = 10_000


def _num(value: Any) -> float:
    """A number from a stored round dict (None, NaN and missing are 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def summarize_rounds(rounds: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One summary of several rounds' ``RoundStats.to_dict()``: counts summed, rates
    recomputed from the counts (not averaged), drop fractions over everything attempted."""
    n = attempted = kept = judged = agreed = written = unique = repeated = 0.0
    dropped: Counter[str] = Counter()
    for r in rounds:
        n += 1
        attempted += _num(r.get("attempted"))
        kept += _num(r.get("kept"))
        j = _num(r.get("judged"))
        judged += j
        agreed += round(_num(r.get("judge_order_agreement_rate")) * j)
        w = _num(r.get("prompts_generated"))
        written += w
        unique += _num(r.get("unique_prompts"))
        repeated += round(_num(r.get("prompt_repetition_rate")) * w)
        for reason, count in (r.get("dropped") or {}).items():
            dropped[str(reason)] += int(_num(count))
    return {
        "rounds": int(n),
        "attempted": int(attempted),
        "kept": int(kept),
        "judged": int(judged),
        "order_agreed": int(agreed),
        "order_agreement_rate": agreed / judged if judged else None,
        "prompts_generated": int(written),
        "unique_prompts": int(unique),
        "prompt_repetition_rate": repeated / written if written else 0.0,
        "dropped": dict(sorted(dropped.items())),
        "dropped_fraction": {k: v / attempted for k, v in sorted(dropped.items())} if attempted else {},
    }


async def sao_stats(session: AsyncSession) -> pb.SaoStats:
    """SAO's figures (see the module docstring)."""
    datasets, pairs, unique = (
        await session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(SaoDatasetRow.train_rows + SaoDatasetRow.validation_rows), 0),
                func.coalesce(func.sum(SaoDatasetRow.unique_prompts), 0),
            )
        )
    ).one()
    recorded = await session.scalars(
        select(SaoRoundRow.rounds).order_by(SaoRoundRow.created_at.desc()).limit(MAX_ROUNDS)
    )
    summary = summarize_rounds(r for rounds in recorded for r in (rounds or []) if isinstance(r, dict))
    out = pb.SaoStats(
        datasets=int(datasets),
        rounds=summary["rounds"],
        pairs=int(pairs),
        unique_prompts=int(unique),
        prompt_repetition_rate=summary["prompt_repetition_rate"],
        order_agreement_rate=summary["order_agreement_rate"] or 0.0,
    )
    out.dropped_fraction.update(summary["dropped_fraction"])
    return out


async def get_stats(session: AsyncSession, *, run_id: str) -> pb.GetStatsResponse:
    """GetStats: RLP's figures (one run's, or every run's for ``run_id`` "") and SAO's."""
    rlp = await rlp_stats(session, run_id or None)
    return pb.GetStatsResponse(rlp=rlp, sao=await sao_stats(session))
