"""Held-out evaluation on the CPU: a reward model trained for a few steps on the tiny Llama is
scored pair by pair, and a DPO adapter is judged against its own base (the adapter switched
off) by fake judges whose preferences the win rate must follow."""

from __future__ import annotations

import asyncio
import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches

from flywheel.trainer.training import TrainSpec, exact_match, train  # noqa: E402 - after the offline switches
from flywheel.trainer.training.evaluate import (  # noqa: E402 - after the offline switches
    evaluate_policy,
    evaluate_reward_model,
    generate,
    wilson_interval,
)

TOKENS = 8
CAPITALS = [
    ("France", "Paris", "Lyon"),
    ("Japan", "Tokyo", "Osaka"),
    ("Italy", "Rome", "Milan"),
    ("Canada", "Ottawa", "Toronto"),
    ("Spain", "Madrid", "Seville"),
    ("Kenya", "Nairobi", "Mombasa"),
    ("Peru", "Lima", "Cusco"),
    ("Egypt", "Cairo", "Giza"),
]


def pairs() -> list[dict]:
    return [
        {"prompt": f"Capital of {country}? Answer with the city alone.\n", "chosen": good, "rejected": bad}
        for country, good, bad in CAPITALS
    ]


def spec(kind: str, **overrides: object) -> TrainSpec:
    fields: dict = {"kind": kind, "base_model": "tiny", "max_steps": 2, "batch_size": 2, "max_length": 64}
    return TrainSpec(**{**fields, "lora": {"r": 4, "alpha": 8}, **overrides})


@pytest.fixture(scope="module")
def reward_adapter(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A large rate and the whole set per step: three steps are enough to rank the pairs it saw.
    run = spec("reward_model", max_steps=3, batch_size=8, learning_rate=0.05)
    return train(run, pairs(), tmp_path_factory.mktemp("rm")).adapter_dir


@pytest.fixture(scope="module")
def policy_adapter(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A large rate so the greedy answers move away from the base's within two steps.
    run = spec("dpo", learning_rate=0.05)
    return train(run, pairs(), tmp_path_factory.mktemp("dpo")).adapter_dir


def held_out_prompts() -> list[dict]:
    return [{"prompt": r["prompt"], "answer": r["chosen"]} for r in pairs()]


def test_wilson_interval_brackets_the_proportion() -> None:
    low, high = wilson_interval(8, 10)
    assert 0.49 < low < 0.8 < high < 0.95  # 0.4902, 0.9433
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    assert wilson_interval(2.5, 5) == pytest.approx((0.1704, 0.8296), abs=1e-4)  # ties: half wins


def test_reward_model_pairwise_accuracy_and_its_mirror(reward_adapter: str) -> None:
    rows = pairs()
    ev = evaluate_reward_model(reward_adapter, "tiny", rows, batch_size=3)
    assert set(ev.metrics) == {
        "pairwise_accuracy",
        "pairwise_accuracy_ci_low",
        "pairwise_accuracy_ci_high",
        "mean_margin",
        "n",
    }
    assert ev.samples == len(rows) and ev.metrics["n"] == len(rows) and len(ev.details) == len(rows)
    acc = ev.metrics["pairwise_accuracy"]
    assert 0 <= ev.metrics["pairwise_accuracy_ci_low"] <= acc <= ev.metrics["pairwise_accuracy_ci_high"] <= 1
    assert acc == sum(d["correct"] for d in ev.details) / len(rows)
    assert acc >= 0.75, ev.details  # trained on these pairs: the evaluation sees what training taught

    assert all(d["score_chosen"] != d["score_rejected"] for d in ev.details)  # no ties, so the mirror is exact
    swapped = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]
    mirror = evaluate_reward_model(reward_adapter, "tiny", swapped, batch_size=8)
    assert mirror.metrics["pairwise_accuracy"] == pytest.approx(1 - acc)
    assert mirror.metrics["mean_margin"] == pytest.approx(-ev.metrics["mean_margin"], abs=1e-4)

    assert evaluate_reward_model(reward_adapter, "tiny", rows, max_samples=3).samples == 3


def test_reward_model_bad_input_names_the_field(reward_adapter: str, policy_adapter: str, tmp_path) -> None:
    with pytest.raises(ValueError, match="'rejected'"):
        evaluate_reward_model(reward_adapter, "tiny", [{"chosen": "a"}])
    with pytest.raises(ValueError, match="rows"):
        evaluate_reward_model(reward_adapter, "tiny", [])
    with pytest.raises(ValueError, match="SEQ_CLS"):
        evaluate_reward_model(policy_adapter, "tiny", pairs())
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        evaluate_reward_model(tmp_path, "tiny", pairs())


def test_generate_with_and_without_the_adapter(policy_adapter: str) -> None:
    prompts = [r["prompt"] for r in held_out_prompts()[:3]]
    chat = [[{"role": "user", "content": p}] for p in prompts[:2]]
    base = generate("tiny", prompts, max_new_tokens=TOKENS, batch_size=2)
    tuned = generate("tiny", prompts + chat, adapter_dir=policy_adapter, max_new_tokens=TOKENS)
    assert len(base) == 3 and len(tuned) == 5
    assert all(isinstance(t, str) for t in base + tuned)
    assert base != tuned[:3]  # the adapter is on
    assert generate("tiny", prompts, max_new_tokens=TOKENS) == base  # greedy: the same every time
    assert generate("tiny", []) == []


async def test_policy_win_rate_follows_the_judge_in_both_orders(policy_adapter: str) -> None:
    rows = held_out_prompts()
    adapter_answers = generate("tiny", [r["prompt"] for r in rows], adapter_dir=policy_adapter, max_new_tokens=TOKENS)
    rows[0]["answer"] = adapter_answers[0]  # the adapter gets exactly one right, the base none
    calls: list[tuple[str, list[str]]] = []

    async def longer(prompt: str, answers: list[str]) -> list[float] | None:
        calls.append((prompt, list(answers)))
        await asyncio.sleep(0)
        return [float(len(a)) for a in answers]

    ev = await evaluate_policy(
        policy_adapter,
        "tiny",
        rows,
        judge_rank=longer,
        metrics=[("exact", exact_match("answer"))],
        max_new_tokens=TOKENS,
    )
    n = len(rows)
    assert ev.samples == n and len(ev.details) == n
    assert [d["adapter"] for d in ev.details] == adapter_answers  # one load: the same as a lone generate()
    expected = [
        1.0 if len(d["adapter"]) > len(d["base"]) else 0.0 if len(d["adapter"]) < len(d["base"]) else 0.5
        for d in ev.details
    ]
    differing = [d for d in ev.details if d["adapter"] != d["base"]]
    assert differing, "the adapter should change some answers"
    assert ev.metrics["win_rate"] == pytest.approx(sum(expected) / n)
    assert ev.metrics["win_rate_ci_low"] <= ev.metrics["win_rate"] <= ev.metrics["win_rate_ci_high"]
    assert (ev.metrics["judged"], ev.metrics["judge_missing"]) == (n, 0)
    assert ev.metrics["identical"] == n - len(differing)
    # Both orders for every differing pair, and no call for identical answers.
    assert len(calls) == 2 * len(differing)
    for d in differing:
        assert (d["prompt"], [d["adapter"], d["base"]]) in calls
        assert (d["prompt"], [d["base"], d["adapter"]]) in calls
    assert ev.metrics["exact"] == pytest.approx(1 / n) and ev.metrics["exact_base"] == 0.0
    assert ev.metrics["exact_delta"] == pytest.approx(1 / n)
    assert ev.details[0]["exact"] == 1.0 and ev.details[0]["exact_base"] == 0.0


async def test_position_bias_cancels_and_missing_verdicts_are_counted(policy_adapter: str) -> None:
    rows = held_out_prompts()
    skipped = rows[1]["prompt"]

    async def first_wins_or_down(prompt: str, answers: list[str]) -> list[float] | None:
        if prompt == skipped:
            return None  # judge unavailable for this one
        return [1.0, 0.0]  # always prefers whatever is shown first

    ev = await evaluate_policy(policy_adapter, "tiny", rows, judge_rank=first_wins_or_down, max_new_tokens=TOKENS)
    differing = sum(d["adapter"] != d["base"] for d in ev.details)
    missing = int(ev.details[1]["adapter"] != ev.details[1]["base"])  # identical answers need no judge
    assert ev.metrics["judge_missing"] == missing and ev.metrics["judged"] == len(rows) - missing
    assert differing and ev.metrics["win_rate"] == 0.5  # pure position bias: every pair a tie
    assert ev.details[1]["win"] is None if missing else ev.details[1]["win"] == 0.5

    async def wrong_length(prompt: str, answers: list[str]) -> list[float] | None:
        return [1.0]

    with pytest.raises(ValueError, match="two finite scores"):
        await evaluate_policy(policy_adapter, "tiny", rows, judge_rank=wrong_length, max_new_tokens=TOKENS)
    with pytest.raises(ValueError, match="'prompt'"):
        await evaluate_policy(policy_adapter, "tiny", [{"text": "x"}], judge_rank=None)

    no_judge = await evaluate_policy(policy_adapter, "tiny", rows[:2], judge_rank=None, max_new_tokens=TOKENS)
    assert set(no_judge.metrics) == {"n"}

    def nothing(prompts: list, completions: list, **columns: object) -> list[float | None]:
        return [None] * len(completions)  # cannot score any: no figure rather than a made-up 0

    twice = await evaluate_policy(
        policy_adapter,
        "tiny",
        rows[:2],
        judge_rank=None,
        metrics=[("m", exact_match("answer")), ("m", exact_match("answer")), ("none", nothing)],
        max_new_tokens=TOKENS,
    )
    assert set(twice.metrics) == {"n", "m", "m_base", "m_delta", "m_2", "m_2_base", "m_2_delta"}
