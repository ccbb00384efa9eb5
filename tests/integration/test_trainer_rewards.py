"""The reward judge as a GRPO reward, against the real judge process: its LLM is unreachable
(a closed port), so every judgement is the judge's heuristic fallback, which still tells
completions apart. Score: one call per completion, concurrently, from TRL's event loop; Rank:
one call per group of num_generations. A judge that is down leaves rewards missing (None),
counted, and the run goes on."""

from __future__ import annotations

import asyncio
import math
import os
import socket

import pytest

from flywheel.core.judge_client import JudgeClient
from flywheel.core.run_policy import RunPolicySettings
from flywheel.trainer.training import TrainSpec, train
from flywheel.trainer.training.reward_sources import JudgeReward, RewardSourceSpec, build_rewards

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROWS = [
    {"prompt": f"Explain briefly why {topic} matters.", "answer": "-"}
    for topic in ("sleep", "exercise", "water", "sunlight")
]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def judge_process(launch_module):
    return launch_module(
        "reward_judge",
        env={
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/judge",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": f"http://127.0.0.1:{closed_port()}/v1",
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-none",
            "FLYWHEEL_REWARD_JUDGE_LLM_TIMEOUT_S": "2",
            "FLYWHEEL_REWARD_JUDGE_LLM_ATTEMPTS": "1",
            "FLYWHEEL_REWARD_JUDGE_LLM_BACKOFF_S": "0",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
        },
    )


def grpo(rewards, **overrides) -> TrainSpec:
    fields: dict = {
        "kind": "grpo",
        "base_model": "tiny",
        "max_steps": 1,
        "batch_size": 2,
        "max_length": 64,
        "num_generations": 2,
        "max_completion_length": 8,
        "beta": 0.04,
        "lora": {"r": 4, "alpha": 8},
        "rewards": rewards,
    }
    fields.update(overrides)
    return TrainSpec(**fields)


def test_the_judge_scores_grpo_completions(judge_process, tmp_path) -> None:
    # Score and Rank side by side in one run (one training instead of one per mode).
    client = JudgeClient(judge_process.address, timeout_s=30)
    score, rank = build_rewards(
        [RewardSourceSpec(judge_rubric="", judge_rank=False), RewardSourceSpec(judge_rubric="", judge_rank=True)],
        judge=client,
        policy=RunPolicySettings(),
        base_model="tiny",  # num_generations left at its default (4): train() sets the spec's (2)
    )
    judges = {False: score.fn, True: rank.fn}
    assert all(isinstance(judge, JudgeReward) for judge in judges.values())
    result = train(grpo([score, rank]), ROWS, tmp_path)

    assert result.global_step == 1 and result.reward and math.isfinite(result.reward[-1]["value"])
    assert result.groups == 2
    for is_rank, judge in judges.items():
        assert judge.failures == 0, judge.last_error
        # 2 prompts x 2 completions: four Score calls, or one Rank call per group of two.
        assert judge.calls == (2 if is_rank else 4), (is_rank, judge.calls)

        # The heuristic tells a structured, relevant answer from a bare one. (A new event loop:
        # the client reconnects, its channel having been made on the trainer's.)
        good = "Sleep matters because the body repairs itself.\n\n- memory consolidates\n- mood steadies"
        scores = asyncio.run(judge(prompts=[ROWS[0]["prompt"]] * 2, completions=[good, "no"]))
        assert all(s is not None and 0 <= s <= 1 for s in scores) and scores[0] > scores[1], (is_rank, scores)


def test_a_judge_that_is_down_leaves_rewards_missing_not_zero(judge_process, tmp_path) -> None:
    down = JudgeClient(f"127.0.0.1:{closed_port()}", timeout_s=2, attempts=1)
    judge = JudgeReward(down, rubric="", rank=False, num_generations=2)
    scores = asyncio.run(judge(prompts=["p", "p"], completions=["a", "b"]))
    assert scores == [None, None] and judge.failures == 2 and "UNAVAILABLE" in judge.last_error

    # With another reward beside it, the run trains on what there is.
    rewards = build_rewards(
        [RewardSourceSpec(judge_rubric=""), RewardSourceSpec(exact_match_column="answer")],
        judge=down,
        policy=RunPolicySettings(),
        base_model="tiny",
    )
    result = train(grpo(list(rewards)), ROWS, tmp_path)
    assert result.global_step == 1 and math.isfinite(result.loss[-1]["value"])
    assert rewards[0].fn.failures == 4 and rewards[0].fn.calls == 4
