"""A whole SAO round against a scripted fake model and judge: every drop reason is counted,
only pairs both judge orders (and the model) agree on are kept, and rounds iterate."""

from __future__ import annotations

import math
import re

import pytest

from flywheel.society.sao import SaoConfig, SaoDataset, run_round, run_rounds
from flywheel.society.sao.personas import generate_personas

from .sao_fakes import FakeJudge, FakeLlm

PROMPTS = [
    "How do I keep a sourdough starter alive while I travel for two weeks?",
    "Which index should my invoices table have for monthly reports?",
    "Explain inflation to a twelve-year-old using pocket money.",
    "How should I plan a cheap three-day trip to Lisbon in April?",
    "What stretches help after a long shift standing on a hard floor?",
    "How can I tell whether a news story about a new drug is overhyped?",
    "Write a polite email asking my landlord to fix the heating this week.",
    "how do i keep a sourdough starter alive while i travel for two weeks",  # repeats #0
    "What is a good way to learn to read sheet music as an adult beginner?",
    "How do I split rent fairly between roommates with different room sizes?",
    "Why does my bread dough not rise in a cold kitchen in the winter?",
    "How do I automate renaming hundreds of photos by the date they were taken?",
]
BIASED, TIE, PROSE, EMPTY, SLOW, WRONG = PROMPTS[1], PROMPTS[2], PROMPTS[3], PROMPTS[4], PROMPTS[5], PROMPTS[6]
SHORT = PROMPTS[8]


def config(**kw) -> SaoConfig:
    base = {"n_personas": 12, "batch_size": 4, "min_response_length": 40, "llm_timeout_s": 0.5, "seed": 3}
    return SaoConfig(**{**base, **kw})


async def test_a_round_keeps_agreed_pairs_and_counts_every_drop():
    llm = FakeLlm(PROMPTS, ranking={PROSE: "prose", EMPTY: "empty", SLOW: "timeout", WRONG: "wrong"}, short={SHORT})
    judge = FakeJudge(biased={BIASED}, tie={TIE})
    result = await run_round(config(), llm=llm, judge=judge, iteration=1)
    s = result.stats
    assert s.personas == 12 and s.personas_from_model == 12
    assert s.prompts_generated == 12 and s.unique_prompts == 11
    assert s.prompt_repetition_rate == pytest.approx(1 / 12)
    assert s.dropped == {
        "duplicate_prompt": 1,
        "too_short": 1,
        "unparsable_ranking": 1,  # prose
        "ranking_llm_empty": 1,
        "ranking_llm_timeout": 1,
        "judge_order_disagreement": 1,
        "judge_tie": 1,
        "self_judge_disagreement": 1,  # the model ranked the bad response first
    }
    assert s.kept == 4 and s.kept + s.dropped_total == s.attempted == s.prompts_generated == 12
    assert s.pairs_generated == 11 and s.self_ranked == 7 and s.judged == 7
    assert s.judge_order_agreement_rate == pytest.approx(5 / 7)
    assert s.self_judge_agreement_rate == pytest.approx(4 / 5)
    # Every kept pair: the good response chosen, both orders asked, The Convergence's keys.
    for r in result.records:
        assert "[good]" in r.chosen and "[bad]" in r.rejected and r.iteration == 1 and r.timestamp
        assert r.chosen_score > r.rejected_score and r.persona
        asked = [resp for p, resp in judge.calls if p == r.prompt]
        assert len(asked) == 2 and asked[0] == asked[1][::-1]
    assert {BIASED, TIE, PROSE, WRONG, SHORT} & {r.prompt for r in result.records} == set()
    # Responses are sampled at the configured temperature; the ranking is greedy.
    assert llm.temperatures["response"] == {0.6} and llm.temperatures["ranking"] == {0.0}
    assert s.to_dict()["dropped_total"] == 8 and s.dropped_fraction("judge_tie") == pytest.approx(1 / 12)


async def test_judge_down_and_model_errors_are_counted_not_raised():
    llm = FakeLlm(PROMPTS[:3], ranking={PROMPTS[0]: "error"}, same={PROMPTS[2]})
    result = await run_round(config(n_personas=3), llm=llm, judge=FakeJudge(down=True))
    assert result.records == []
    assert result.stats.dropped == {"ranking_llm_error": 1, "identical_responses": 1, "judge_unavailable": 1}
    assert math.isnan(result.stats.judge_order_agreement_rate)


async def test_without_self_agreement_the_model_label_is_kept():
    llm = FakeLlm([PROMPTS[6], PROMPTS[0]], ranking={PROMPTS[6]: "wrong"})
    result = await run_round(config(n_personas=2, require_self_agreement=False), llm=llm, judge=FakeJudge())
    assert result.stats.kept == 2
    wrong = next(r for r in result.records if r.prompt == PROMPTS[6])
    assert "[bad]" in wrong.chosen  # the paper's label: the model's own ranking


async def test_existing_prompts_and_trace_prompts():
    existing = SaoDataset()
    first = await run_round(config(n_personas=2), llm=FakeLlm(PROMPTS[9:11]), judge=FakeJudge())
    existing.extend(first.records)
    again = await run_round(
        config(n_personas=2), llm=FakeLlm(PROMPTS[9:11]), judge=FakeJudge(), existing=existing,
        trace_prompts=["A real user's question about shipping costs to Norway?", "  "],
    )  # fmt: skip
    assert again.stats.dropped == {"duplicate_prompt": 2}
    assert again.stats.trace_prompts == 1 and again.stats.kept == 1
    assert again.records[0].persona == ""  # a trace prompt has no persona


async def test_rounds_iterate_with_fresh_personas_and_a_policy_per_round():
    made = []

    def policy(iteration: int) -> FakeLlm:
        made.append(iteration)
        return FakeLlm([p + f" (round {iteration})" for p in PROMPTS[9:12]])

    seen_rounds = []

    async def on_round(result):
        seen_rounds.append(result.stats.iteration)

    cfg = config(n_personas=3, iterative_rounds=2)
    ds, stats = await run_rounds(cfg, llm=policy, judge=FakeJudge(), on_round=on_round)
    assert made == [1, 2] and seen_rounds == [1, 2] and [s.iteration for s in stats] == [1, 2]
    assert {r.iteration for r in ds.records} == {1, 2} and len(ds) == sum(s.kept for s in stats)


async def test_personas_are_at_least_n_distinct_and_fall_back_when_the_model_repeats():
    class Parrot:
        async def complete(self, messages, *, temperature, max_tokens):
            return "A person who likes things and asks questions about many topics."

    personas = await generate_personas(Parrot(), config(n_personas=120))
    assert len(personas) == 120 and len({p.description for p in personas}) == 120
    assert sum(p.from_model for p in personas) == 1  # the rest repeat it: attribute sentences stand in
    again = await generate_personas(Parrot(), config(n_personas=120))
    assert [p.description for p in again] == [p.description for p in personas]  # seeded


def test_config_names_and_bad_values():
    c = SaoConfig(n_personas=100, temperature=0.6, min_response_length=50, similarity_threshold=0.9)
    assert (c.iterative_rounds, c.batch_size, c.response_pairs) == (3, 10, 2)
    with pytest.raises(ValueError, match="similarity_threshold"):
        SaoConfig(similarity_threshold=1.5)
    with pytest.raises(ValueError, match="n_persona"):
        SaoConfig(n_persona=3)  # a typo is refused, naming the field


YOUNG = re.compile(r"\b(17|21)-year-old")


async def test_prompt_and_response_failures_are_counted_by_step():
    class Flaky(FakeLlm):
        async def complete(self, messages, *, temperature, max_tokens):
            text = messages[-1]["content"]
            if text.startswith("Persona:") and YOUNG.search(text):
                raise TimeoutError
            if text == PROMPTS[10]:
                return ""
            return await super().complete(messages, temperature=temperature, max_tokens=max_tokens)

    result = await run_round(config(n_personas=40), llm=Flaky([PROMPTS[10], *PROMPTS[:1]]), judge=FakeJudge())
    s = result.stats
    young = sum(bool(YOUNG.search(p.description)) for p in result.personas)
    assert young > 0 and s.dropped["prompt_llm_timeout"] == young
    assert s.dropped["response_llm_empty"] == 1 and s.kept == 1
    assert s.kept + s.dropped_total == s.attempted == 40
    assert s.to_dict()["dropped_fraction"]["prompt_llm_timeout"] == pytest.approx(young / 40)
