"""MinHash near-duplicates, diversity figures and seeded personas."""

from __future__ import annotations

from flywheel.society.sao.diversity import distinct_n, measure, repetition_rate
from flywheel.society.sao.filters import MinHasher, NearDuplicateIndex, jaccard, shingles, text_key
from flywheel.society.sao.personas import sample, space_size

BASE = "How do I keep my sourdough starter alive while I travel for two weeks in the summer heat"


def test_minhash_estimates_jaccard():
    other = BASE.replace("two weeks", "three weeks")
    exact = jaccard(shingles(BASE), shingles(other))
    h = MinHasher(256)
    est = MinHasher.similarity(h.signature(BASE), h.signature(other))
    assert abs(est - exact) < 0.12, (est, exact)
    unrelated = "Which index should a PostgreSQL table of invoices have for monthly reports"
    assert MinHasher.similarity(h.signature(BASE), h.signature(unrelated)) < 0.1


def test_near_duplicates_are_refused_at_the_threshold():
    index = NearDuplicateIndex(0.9)
    assert index.add_if_new(BASE)
    assert not index.add_if_new(BASE.upper() + "!!")  # same text key
    assert not index.add_if_new("  " + BASE + " ")
    assert index.add_if_new("Plan a cheap three-day trip to Lisbon for a family of four in April")
    loose = NearDuplicateIndex(0.5)
    loose.add_if_new(BASE)
    assert not loose.add_if_new(BASE.replace("summer heat", "winter cold"))
    assert len(index) == 2


def test_repetition_rate_and_distinct_n():
    prompts = ["What is DNS?", "what is dns", "Explain TCP.", "Explain TCP", "Why is the sky blue?"]
    assert repetition_rate(prompts) == 1 - 3 / 5
    assert repetition_rate([]) == 0.0
    d = measure(prompts)
    assert (d.prompts, d.unique_prompts) == (5, 3) and d.near_duplicate_rate == 2 / 5
    assert 0 < distinct_n(prompts) <= 1
    assert text_key("Hello,   World!") == "hello world"


def test_personas_are_seeded_distinct_and_many():
    a, b = sample(150, seed=7), sample(150, seed=7)
    assert a == b and sample(150, seed=8) != a
    assert len({tuple(sorted(p.items())) for p in a}) == 150
    assert space_size() > 1_000_000
