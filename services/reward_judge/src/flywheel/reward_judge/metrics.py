"""Prometheus metrics of the judge (served on the service's /metrics with the shared ones)."""

from prometheus_client import Counter, Gauge

LLM_CALLS = Counter(
    "flywheel_judge_llm_calls_total", "LLM judge calls by outcome (ok, repaired, malformed, error)", ["outcome"]
)
JUDGEMENTS = Counter(
    "flywheel_judge_judgements_total", "Judgements by judge id and whether a fallback answered", ["judge", "fallback"]
)
CACHE = Counter("flywheel_judge_cache_total", "Judgement cache lookups by result (hit, miss)", ["result"])
SWAP_AGREEMENT = Gauge("flywheel_judge_swap_agreement", "Share of pairs judged alike in both orders", ["judge"])
FALLBACK_RATE = Gauge("flywheel_judge_fallback_rate", "Share of judgements a fallback answered", ["judge"])
HUMAN_SPEARMAN = Gauge("flywheel_judge_human_spearman", "Spearman correlation with human scores", ["judge"])
HUMAN_KENDALL = Gauge("flywheel_judge_human_kendall", "Kendall tau with human scores", ["judge"])
