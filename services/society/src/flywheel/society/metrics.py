"""The society's Prometheus metrics (served on the service's metrics port with the shared ones).

SAO counters are incremented where things happen (rounds, pairs kept and dropped by reason,
datasets, training jobs); the gauges (RLP's buffer, hit rate and mean reward, SAO's agreement
and repetition rates) are set from the tables by :func:`refresh`, which the service runs every
``REFRESH_S`` seconds, so every replica exports the same figures as GetStats."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from flywheel.core.logging import get_logger

log = get_logger(__name__)
REFRESH_S = 30.0

SAO_ROUNDS = Counter("flywheel_society_sao_rounds_total", "SAO rounds by state reached", ["state"])
SAO_ROUND_SECONDS = Histogram(
    "flywheel_society_sao_round_seconds",
    "Time to run one queued SAO round (all its iterative rounds)",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
)
SAO_PAIRS_KEPT = Counter("flywheel_society_sao_pairs_kept_total", "SAO preference pairs kept")
SAO_PAIRS_DROPPED = Counter("flywheel_society_sao_pairs_dropped_total", "SAO pairs dropped, by reason", ["reason"])
SAO_PAIRS_JUDGED = Counter(
    "flywheel_society_sao_pairs_judged_total", "SAO pairs the reward judge ranked in both orders"
)
SAO_PAIRS_ORDER_AGREED = Counter(
    "flywheel_society_sao_pairs_order_agreed_total", "SAO pairs whose two judge orders named the same winner"
)
SAO_DATASETS = Counter("flywheel_society_sao_datasets_total", "SAO datasets registered, by source", ["source"])
SAO_TRAINING_JOBS = Counter("flywheel_society_sao_training_jobs_total", "Preference jobs submitted for SAO datasets")
SAO_EVENTS_LOST = Counter(
    "flywheel_society_sao_dataset_events_unpublished_total", "SaoDatasetEvents not published after retries"
)

SAO_ORDER_AGREEMENT = Gauge(
    "flywheel_society_sao_order_agreement_rate", "Share of judged SAO pairs both orders agreed on"
)
SAO_REPETITION = Gauge("flywheel_society_sao_prompt_repetition_rate", "Share of SAO prompts repeating an earlier one")
SAO_PAIRS = Gauge("flywheel_society_sao_pairs", "Preference pairs in registered SAO datasets")
RLP_BUFFER = Gauge("flywheel_society_rlp_buffer_size", "Experiences in RLP's buffer (all search spaces)")
RLP_HIT_RATE = Gauge("flywheel_society_rlp_hit_rate", "Share of resolved RLP proposals beating their generation median")
RLP_MEAN_REWARD = Gauge("flywheel_society_rlp_mean_reward", "Mean information-gain reward of buffered thoughts")
RLP_PROPOSALS = Gauge("flywheel_society_rlp_proposals", "RLP proposals sent to runs")
RLP_STEPS_FAILED = Gauge("flywheel_society_rlp_steps_failed", "RLP steps that failed")


def record_round(stats: Any) -> None:
    """Count one finished SAO round (a :class:`flywheel.society.sao.RoundStats`)."""
    SAO_PAIRS_KEPT.inc(stats.kept)
    for reason, n in stats.dropped.items():
        SAO_PAIRS_DROPPED.labels(reason=reason).inc(n)
    SAO_PAIRS_JUDGED.inc(stats.judged)
    rate = stats.judge_order_agreement_rate
    if stats.judged and rate == rate:  # NaN when nothing was judged
        SAO_PAIRS_ORDER_AGREED.inc(round(rate * stats.judged))


def set_gauges(stats: Any) -> None:
    """Set the gauges from a GetStatsResponse."""
    SAO_ORDER_AGREEMENT.set(stats.sao.order_agreement_rate)
    SAO_REPETITION.set(stats.sao.prompt_repetition_rate)
    SAO_PAIRS.set(stats.sao.pairs)
    RLP_BUFFER.set(stats.rlp.buffer_size)
    RLP_HIT_RATE.set(stats.rlp.hit_rate)
    RLP_MEAN_REWARD.set(stats.rlp.mean_reward)
    RLP_PROPOSALS.set(stats.rlp.proposals)
    RLP_STEPS_FAILED.set(stats.rlp.steps_failed)


async def refresh(session: Any) -> None:
    """Set the gauges from the tables (one GetStats over every run)."""
    from flywheel.society.stats import get_stats

    set_gauges(await get_stats(session, run_id=""))


async def refresh_forever(sessions: Any, *, interval_s: float = REFRESH_S) -> None:
    """The background task: :func:`refresh` every ``interval_s``; a failure is logged."""
    while True:
        try:
            async with sessions() as session:
                await refresh(session)
        except Exception as exc:  # noqa: BLE001 - PostgreSQL away: the gauges keep their last value
            log.warning("society metrics refresh failed", error=repr(exc))
        await asyncio.sleep(interval_s)
