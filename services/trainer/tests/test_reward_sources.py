"""Reward sources for GRPO/RLOO on the CPU: a reward model trained here (from the trace store's
scored rows, turned into pairs) and then used as a GRPO reward; verifiable rewards (exact match
with the loop's one normalisation, a run-policy-checked callable) and the refusals."""

from __future__ import annotations

import json
import math
import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches
from pydantic import ValidationError  # noqa: E402 - after the offline switches

from flywheel.api.trainer.v1 import jobs_pb2  # noqa: E402 - after the offline switches
from flywheel.core.callables import CallableRefused  # noqa: E402 - after the offline switches
from flywheel.core.run_policy import RunPolicySettings  # noqa: E402 - after the offline switches
from flywheel.trainer.training import TrainSpec, exact_match, train  # noqa: E402 - after the offline switches
from flywheel.trainer.training.reward_model import pairs_from_scores  # noqa: E402 - after the offline switches
from flywheel.trainer.training.reward_sources import (  # noqa: E402 - after the offline switches
    RewardModelReward,
    RewardSourceSpec,
    build_rewards,
    from_proto,
)

PROMPTS = [f"Capital of {c}? Answer with the city alone.\n" for c in ("France", "Japan", "Italy", "Peru")]
ANSWERS = ["Paris", "Tokyo", "Rome", "Lima"]
NOBODY = RunPolicySettings(callable_modules=[])


def shortness(prompts: list, completions: list, **columns: object) -> list[float]:
    """An allowed verifiable reward for the tests: shorter is better."""
    return [-len(str(c)) / 10 for c in completions]


def trace_store_rows() -> list[dict]:
    """The trace store's reward export: prompt, response, score (and provenance)."""
    rows = []
    for i, (prompt, answer) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        for j, (response, score) in enumerate(((answer, 0.9), (f"I think {answer}?", 0.6), ("No idea.", 0.1))):
            rows.append({"prompt": prompt, "response": response, "score": score, "trace_ids": [f"t{i}{j}"]})
    return rows


def test_scored_rows_become_pairs_within_each_prompt() -> None:
    pairs = pairs_from_scores(trace_store_rows())
    assert len(pairs) == 4 * 3  # three responses per prompt: three pairs, none across prompts
    france = [p for p in pairs if "France" in p["prompt"]]
    assert {(p["chosen"], p["rejected"]) for p in france} == {
        ("Paris", "No idea."),
        ("Paris", "I think Paris?"),
        ("I think Paris?", "No idea."),
    }
    assert france[0]["margin"] == pytest.approx(0.8)  # the largest margin first
    assert all(p["margin"] > 0 for p in pairs)
    completion_rows = [{"prompt": "p", "completion": c, "score": s} for c, s in (("a", 1.0), ("b", 1.0))]
    with pytest.raises(ValueError, match="same score"):
        pairs_from_scores(completion_rows)
    with pytest.raises(ValueError, match="row 0: score"):
        pairs_from_scores([{"prompt": "p", "completion": "a", "score": float("nan")}])


def test_reward_model_from_scores_then_as_a_grpo_reward(tmp_path) -> None:
    rm_spec = TrainSpec(
        kind="reward_model", base_model="tiny", max_steps=2, batch_size=2, max_length=64, lora={"r": 4, "alpha": 8}
    )
    rm = train(rm_spec, trace_store_rows(), tmp_path / "rm")
    assert rm.global_step == 2 and rm.final_loss is not None and math.isfinite(rm.final_loss)

    # The version folder as the registry would hand it over: adapter/ + training_results.json.
    (source,) = build_rewards(
        [RewardSourceSpec(reward_model_dir=str(tmp_path / "rm"), weight=0.5)],
        judge=None,
        policy=NOBODY,
        base_model="unused: the results name the base",
    )
    scorer = source.fn
    assert isinstance(scorer, RewardModelReward) and scorer.base == "tiny" and source.weight == 0.5
    prompts, completions = [PROMPTS[0]] * 3, ["Paris", "No idea.", "Paris"]
    scores = scorer(prompts=prompts, completions=completions)
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert scores[0] == pytest.approx(scores[2]) and scores[0] != pytest.approx(scores[1])
    # The trained score head is loaded, not a fresh random one: a second load scores the same.
    again = RewardModelReward(tmp_path / "rm" / "adapter")
    assert again(prompts=prompts, completions=completions) == pytest.approx(scores, abs=1e-5)

    grpo = TrainSpec(
        kind="grpo",
        base_model="tiny",
        max_steps=1,
        batch_size=2,
        max_length=64,
        num_generations=2,
        max_completion_length=6,
        beta=0.04,
        lora={"r": 4, "alpha": 8},
        rewards=[source],
    )
    rows = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    result = train(grpo, rows, tmp_path / "grpo")
    assert result.global_step == 1 and result.reward and math.isfinite(result.reward[-1]["value"])
    assert result.groups == 2 and result.flat_groups == 0  # a logit differs between different completions
    saved = json.loads((tmp_path / "grpo" / "training_results.json").read_text())
    assert saved["rewards"] == [{"name": "reward_model:rm", "weight": 0.5}]


def test_verifiable_rewards_and_refusals(tmp_path) -> None:
    allowed = RunPolicySettings(callable_modules=[__name__])
    em, short = build_rewards(
        [
            RewardSourceSpec(exact_match_column="answer"),
            RewardSourceSpec(callable=f"{__name__}:shortness", weight=0.1),
        ],
        judge=None,
        policy=allowed,
        base_model="tiny",
    )
    # The loop's one normalisation (flywheel.core.text_metrics): case, spacing, surrounding punctuation.
    assert em.fn(prompts=["p"] * 3, completions=[" paris. ", "Paris, France", "PARIS"], answer=["Paris"] * 3) == [
        1.0,
        0.0,
        1.0,
    ]
    assert exact_match("answer")(
        prompts=["p"], completions=[[{"role": "assistant", "content": "Rome!"}]], answer=["rome"]
    ) == [1.0]
    assert short.fn is shortness and short.name == f"{__name__}:shortness"

    with pytest.raises(ValueError, match=r"rewards\[0\]\.callable: 'os:system'"):
        build_rewards([RewardSourceSpec(callable="os:system")], judge=None, policy=allowed, base_model="tiny")
    with pytest.raises(CallableRefused, match=f"'{__name__}:shortness': module .* is not one runs may call"):
        build_rewards(
            [RewardSourceSpec(callable=f"{__name__}:shortness")], judge=None, policy=NOBODY, base_model="tiny"
        )
    with pytest.raises(ValueError, match="no judge client"):
        build_rewards([RewardSourceSpec(judge_rubric="")], judge=None, policy=NOBODY, base_model="tiny")
    with pytest.raises(ValueError, match="no LoRA adapter"):
        build_rewards([RewardSourceSpec(reward_model_dir=str(tmp_path))], judge=None, policy=NOBODY, base_model="tiny")
    with pytest.raises(ValidationError, match="exactly one of"):
        RewardSourceSpec(exact_match_column="answer", callable=f"{__name__}:shortness")
    with pytest.raises(ValidationError, match="exactly one of"):
        RewardSourceSpec()
    with pytest.raises(ValidationError, match="weight"):
        RewardSourceSpec(exact_match_column="answer", weight=float("inf"))
    with pytest.raises(ValidationError, match="judge_rank"):
        RewardSourceSpec(exact_match_column="answer", judge_rank=True)


def test_gpu_speedups_switch_on_with_cuda_only(tmp_path, monkeypatch) -> None:
    import importlib.util
    from types import SimpleNamespace

    from flywheel.trainer.training.common import Context

    def context(kind: str, device: str, attention: str) -> Context:
        model = SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention))
        spec = TrainSpec(kind=kind, base_model="tiny", max_steps=1)
        return Context(spec, model, None, None, None, [], tmp_path, device)

    cpu = context("sft", "cpu", "flash_attention_2").args()
    assert not cpu["bf16"] and "padding_free" not in cpu and "use_liger_kernel" not in cpu
    flash = context("sft", "cuda", "flash_attention_2").args()
    assert flash["bf16"] and flash["padding_free"] and flash["packing_strategy"] == "bfd"
    assert "padding_free" not in context("sft", "cuda", "sdpa").args()  # packed rows would see each other
    assert "padding_free" not in context("dpo", "cuda", "flash_attention_2").args()  # disabled in TRL 1.16
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel" else real_find_spec(name, *a)
    )
    assert context("dpo", "cuda", "sdpa").args()["use_liger_kernel"] is True
    assert "use_liger_kernel" not in context("dpo", "cpu", "sdpa").args()


def test_a_jobs_reward_sources_from_the_proto() -> None:
    judge = jobs_pb2.RewardSource(weight=0.5, judge=jobs_pb2.JudgeReward(rubric="helpful", rank=True))
    assert from_proto(judge) == RewardSourceSpec(weight=0.5, judge_rubric="helpful", judge_rank=True)
    em = jobs_pb2.RewardSource(weight=1, verifiable=jobs_pb2.VerifiableReward(exact_match_column="answer"))
    assert from_proto(em).exact_match_column == "answer"
    fn = jobs_pb2.RewardSource(weight=1, verifiable=jobs_pb2.VerifiableReward(callable="pkg.mod:f"))
    assert from_proto(fn).callable == "pkg.mod:f"
    rm = jobs_pb2.RewardSource(weight=2, reward_policy_id="rm-v3")
    assert from_proto(rm, reward_model_dir="/v/rm-v3").reward_model_dir == "/v/rm-v3"
    with pytest.raises(ValueError, match="'rm-v3': the version's folder was not given"):
        from_proto(rm)
    with pytest.raises(ValueError, match="none of"):
        from_proto(jobs_pb2.RewardSource(weight=1))
