"""Resolving an RLP step (pure): matching proposals to candidates, medians and hits, waiting
while a proposal is raced, GAE over generations, the context and the stats' trend."""

from __future__ import annotations

import pytest

from flywheel.society.rlp.context import build_context, params_key, space_fingerprint
from flywheel.society.rlp.resolution import generation_medians, resolve, step_gae, thoughts_from_json
from flywheel.society.rlp.stats import slope, trend_label
from flywheel.society.rlp.thoughts import ProposedConfig, Thought


def cand(gen: int, params: dict, score: float, cases: int = 3, origin: str = "offspring") -> dict:
    return {"candidate_id": f"c{gen}{score}", "generation": gen, "params": params, "origin": origin,
            "score": score, "cases": cases, "failed": 0}  # fmt: skip


THOUGHTS = [
    Thought("high temperature helps", [ProposedConfig({"t": 0.9, "n": 512}, 0.8, 0.05)]),
    Thought("low temperature helps", [ProposedConfig({"t": 0.1, "n": 256}, 0.7, None)]),
    Thought("nothing evaluated", [ProposedConfig({"t": 0.5, "n": 128}, 0.6, 0.1)]),
]
SENT = [{"config": {"t": 0.9, "n": 512}}, {"config": {"t": 0.1, "n": 256}}]


def test_struct_doubles_match_the_ints_that_were_proposed() -> None:
    assert params_key({"n": 512.0, "t": 0.9000000000001}) == params_key({"t": 0.9, "n": 512})
    assert params_key({"n": 512.5}) != params_key({"n": 512})


def test_hits_are_against_the_median_of_the_candidates_generation() -> None:
    candidates = [
        cand(0, {"t": 0.3, "n": 1}, 0.2),
        cand(0, {"t": 0.9, "n": 512.0}, 0.9, origin="rlp"),  # Struct gives 512.0 back
        cand(0, {"t": 0.1, "n": 256.0}, 0.3, origin="rlp"),
        cand(0, {"t": 0.4, "n": 2}, 0.5),
        cand(0, {"t": 0.6, "n": 3}, 0.0, cases=0),  # never evaluated: not in the median
        cand(1, {"t": 0.7, "n": 4}, 0.95),
    ]
    assert generation_medians(candidates) == {0: pytest.approx(0.4), 1: pytest.approx(0.95)}
    res = resolve(THOUGHTS, SENT, candidates, current_generation=1, finished=False)
    assert res.ready
    hot, cold = res.observed[params_key({"t": 0.9, "n": 512})], res.observed[params_key({"t": 0.1, "n": 256})]
    assert (hot.score, hot.median, hot.hit) == (0.9, pytest.approx(0.4), True)
    assert (cold.score, cold.hit) == (0.3, False)
    # Each thought's outcome is keyed as its predictions are; the third has none.
    assert res.thoughts == [{THOUGHTS[0].proposals[0].key: 0.9}, {THOUGHTS[1].proposals[0].key: 0.3}, {}]


def test_a_step_waits_while_its_proposal_is_raced_unless_the_run_finished() -> None:
    late = [cand(1, {"t": 0.9, "n": 512}, 0.9, origin="rlp"), cand(1, {"t": 0.2, "n": 9}, 0.1)]
    waiting = resolve(THOUGHTS, SENT, late, current_generation=1, finished=False)
    assert not waiting.ready and waiting.waiting == [params_key({"t": 0.9, "n": 512})]
    done = resolve(THOUGHTS, SENT, late, current_generation=1, finished=True)
    assert done.ready and done.thoughts[0] == {THOUGHTS[0].proposals[0].key: 0.9}
    assert done.thoughts[1] == {}  # never made into a candidate (rejected or raced out)


def test_configs_shown_in_the_steps_context_earn_no_reward() -> None:
    known = [cand(0, {"t": 0.9, "n": 512}, 0.9), cand(1, {"t": 0.1, "n": 256}, 0.3, origin="rlp")]
    res = resolve(THOUGHTS, SENT[1:], known, current_generation=2, finished=False, step_generation=1)
    assert res.thoughts == [{}, {THOUGHTS[1].proposals[0].key: 0.3}, {}]  # 0.9/512 was in its history


def test_thoughts_round_trip_through_their_json() -> None:
    raw = [{"text": "x", "proposals": [{"params": {"a": 1}, "predicted_score": 0.5, "sigma": None, "key": "k"}]}]
    (t,) = thoughts_from_json(raw)
    assert t.text == "x" and t.proposals[0].params == {"a": 1} and t.proposals[0].sigma is None


def test_gae_over_steps_is_the_discounted_sum_of_later_rewards() -> None:
    g, lam = 0.99, 0.95
    a = step_gae([1.0, -0.5, 2.0], gamma=g, gae_lambda=lam, done=True)
    assert a[2] == pytest.approx(2.0)
    assert a[1] == pytest.approx(-0.5 + g * lam * 2.0)
    assert a[0] == pytest.approx(1.0 + g * lam * a[1])
    assert step_gae([], gamma=g, gae_lambda=lam, done=False) == []


def test_the_context_shows_few_shot_examples_bounded() -> None:
    messages, context = build_context(
        history=[{"params": {"t": 0.5}, "score": 0.4}],
        search_space={"t": {"type": "float", "min": 0, "max": 1}},
        n_thoughts=2,
        proposals_per_thought=1,
        examples=[{"thought": "warm is better " * 200, "outcome": "Observed outcome:\n- a: score 0.9"}],
    )
    assert "Earlier thought: warm is better" in messages[-1]["content"]
    assert len(messages[-1]["content"]) < 3000  # the 3000-character thought was cut
    assert context.startswith("<|system|>") and context.endswith("<|assistant|>\n")
    assert space_fingerprint({"b": 1, "a": [1, 2]}) == space_fingerprint({"a": [1, 2], "b": 1})


def test_trend_labels() -> None:
    assert slope([0.0, 1.0, 2.0]) == pytest.approx(1.0)
    assert trend_label([0.0, 0.5, 1.0, 1.5])[1] == "improving"
    assert trend_label([1.5, 1.0, 0.5, 0.0])[1] == "declining"
    assert trend_label([1.0, 1.01, 0.99, 1.0, 1.0, 0.99, 1.01])[1] == "stable"
    assert trend_label([1.0, 2.0]) == (pytest.approx(1.0), "stable")  # too few to say
