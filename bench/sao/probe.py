"""Why the bench does not let SmolLM2-135M write its judgements: how often its answers parse.

    python bench/sao/probe.py   # 8 prompts, 2 sampled responses each (~10-15 min on 2 loaded cores)

For 8 how-to prompts, two responses at temperature 0.6, then (1) the reward judge's own LLM
judge prompt (``flywheel.reward_judge.prompts.judge_messages``, default rubric, both orders)
answered greedily in 160 tokens and read by the judge's parser, and (2) the SAO library's
ranking request (``ranking_messages``) answered greedily in 128 tokens and read by
``parse_ranking``. Prints how many of each parse and how long they took."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learning"))

import generate

from flywheel.reward_judge.parsing import MalformedAnswer, extract_json, read_scores
from flywheel.reward_judge.prompts import judge_messages
from flywheel.reward_judge.rubric import presets
from flywheel.society.sao.judge import parse_ranking, ranking_messages

TOPICS = (
    "bake bread", "fix a flat tire", "learn Python", "save money", "plan a trip to Rome",
    "write a cover letter", "sleep better", "start running",
)  # fmt: skip


def main() -> int:
    gen = generate.load()
    prompts = [f"How do I {t}?" for t in TOPICS]
    pairs = generate.generate(gen, prompts, samples=2, temperature=0.6, max_new_tokens=96)
    rubric = presets()["default"]
    criteria = [c.name for c in rubric.criteria]
    asks = [
        judge_messages(rubric, p, order, relative=True)
        for p, (a, b) in zip(prompts, pairs, strict=True)
        for order in ([a, b], [b, a])
    ]
    t = time.monotonic()
    answers = [o[0] for o in generate.generate(gen, asks, max_new_tokens=160)]
    judge_s = time.monotonic() - t
    parsed = 0
    for text in answers:
        try:
            read_scores(extract_json(text).data, ids=["R1", "R2"], criteria=criteria)
            parsed += 1
        except MalformedAnswer:
            pass
    t = time.monotonic()
    rankings = [
        o[0]
        for o in generate.generate(
            gen, [ranking_messages(p, a, b) for p, (a, b) in zip(prompts, pairs, strict=True)], max_new_tokens=128
        )
    ]
    rank_s = time.monotonic() - t
    ranked = sum(parse_ranking(r) is not None for r in rankings)
    print(f"LLM judge answers that parse: {parsed} of {len(answers)} ({judge_s:.0f} s)")
    print(f"self-rankings that parse: {ranked} of {len(rankings)} ({rank_s:.0f} s)")
    for text in answers[:2] + rankings[:2]:
        print("  ", repr(text[:160]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
