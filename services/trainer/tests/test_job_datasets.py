"""A job's dataset and its dry run, without servers: manifests read through a fake object store
(the real one is in tests/integration/test_trainer_datasets.py), every bad dataset refused with
a message naming the split, row and column, and dry-run figures that are deterministic, measured
with the tokenizer and consistent with what PEFT would train."""

from __future__ import annotations

import hashlib
import json
import math
import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches

from flywheel.api.trainer.v1 import jobs_pb2  # noqa: E402 - after the offline switches
from flywheel.modelserver.tiny import build_tokenizer  # noqa: E402 - after the offline switches
from flywheel.trainer.jobs.datasets import (  # noqa: E402 - after the offline switches
    DatasetError,
    check_rows,
    load_dataset,
    parse_manifest_uri,
)
from flywheel.trainer.jobs.dry_run import estimate, to_proto  # noqa: E402 - after the offline switches
from flywheel.trainer.training import RewardFunction, TrainSpec  # noqa: E402 - after the offline switches


@pytest.fixture(scope="module")
def byte_tokenizer():
    """One token per UTF-8 byte: token counts are known exactly."""
    return build_tokenizer()


def dpo_rows(n: int = 12) -> list[dict]:
    return [
        {
            "prompt": f"Q{i:02d}? ",
            "chosen": "Yes.",
            "rejected": "No!!",
            "chosen_score": 0.9,
            "rejected_score": 0.1 * (i % 3),
        }
        for i in range(n)
    ]


def sft_rows(n: int = 12) -> list[dict]:
    return [{"prompt": f"Q{i:02d}? ", "completion": "Answer.", "score": 0.5 + i / 100} for i in range(n)]


def kto_rows(n: int = 12) -> list[dict]:
    return [{"prompt": f"Q{i:02d}? ", "completion": "Answer.", "label": i % 4 != 0} for i in range(n)]


# --- parse_manifest_uri -----------------------------------------------------------------------


def test_manifest_uri_is_parsed_and_bad_ones_named():
    assert parse_manifest_uri("s3://fw-datasets/preference/ds-1/manifest.json") == (
        "fw-datasets",
        "preference/ds-1/manifest.json",
    )
    for uri, problem in [
        ("http://fw-datasets/a/manifest.json", "must start with s3://"),
        ("s3://Bad_Bucket/a/manifest.json", "not an S3 bucket name"),
        ("s3://fw-datasets", "no object key"),
        ("s3://fw-datasets/a/", "no object key"),
        ("s3://fw-datasets/a/train.jsonl", "not a manifest"),
    ]:
        with pytest.raises(ValueError, match=problem):
            parse_manifest_uri(uri)


# --- load_dataset through a fake object store ---------------------------------------------------


class FakeObjects:
    """ObjectStore.get_object over a dict, with the same errors."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    async def get_object(self, bucket: str, key: str, *, max_bytes: int | None = None) -> bytes:
        if (bucket, key) not in self.objects:
            raise FileNotFoundError(f"s3://{bucket}/{key}: NoSuchKey")
        data = self.objects[(bucket, key)]
        if max_bytes is not None and len(data) > max_bytes:
            raise ValueError("too large")
        return data


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def publish(store: FakeObjects, splits: dict[str, list[dict]], **manifest_extra) -> str:
    """A dataset in the trace store's layout; returns its manifest URI."""
    files = []
    for split, rows in splits.items():
        data = jsonl(rows)
        key = f"reward/ds-1/{split}.jsonl"
        store.objects[("fw-datasets", key)] = data
        files.append({"split": split, "key": key, "rows": len(rows), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"dataset_id": "ds-1", "kind": "reward", "format": "jsonl", "bucket": "fw-datasets", "files": files}
    manifest.update(manifest_extra)
    store.objects[("fw-datasets", "reward/ds-1/manifest.json")] = json.dumps(manifest).encode()
    return "s3://fw-datasets/reward/ds-1/manifest.json"


def reward_export(n: int) -> list[dict]:
    return [
        {"prompt": f"P{i // 2}", "response": f"R{i}", "score": i / n, "trace_ids": [f"t{i}", f"t{i + 100}"]}
        for i in range(n)
    ]


async def test_reward_export_loads_with_provenance_dropped_and_response_renamed():
    store = FakeObjects()
    uri = publish(store, {"train": reward_export(12), "validation": reward_export(4)[:2]})
    loaded = await load_dataset(store, uri)
    assert len(loaded.train) == 12 and len(loaded.validation) == 2
    assert loaded.columns == {"prompt", "completion", "score"}  # trace_ids gone, response -> completion
    assert loaded.train[0] == {"prompt": "P0", "completion": "R0", "score": 0.0}
    assert loaded.source_traces == 24  # t0..t11 and t100..t111 (the validation ids repeat train's)
    raw = store.objects[("fw-datasets", "reward/ds-1/manifest.json")]
    assert loaded.manifest_sha256 == hashlib.sha256(raw).hexdigest()
    assert loaded.manifest["dataset_id"] == "ds-1"
    assert check_rows("reward_model", loaded.train, loaded.validation) == []


async def test_bad_manifests_and_files_are_refused_naming_the_object():
    store = FakeObjects()
    uri = publish(store, {"train": reward_export(12)})
    loaded = await load_dataset(store, uri)
    assert loaded.validation == [] and loaded.train

    tampered = FakeObjects()
    uri = publish(tampered, {"train": reward_export(12)})
    tampered.objects[("fw-datasets", "reward/ds-1/train.jsonl")] += b'{"prompt": "x", "response": "y", "score": 1}\n'
    with pytest.raises(DatasetError, match=r"train\.jsonl: sha256 [0-9a-f]{64} differs from the manifest's"):
        await load_dataset(tampered, uri)

    def manifest_case(mutate) -> FakeObjects:
        s = FakeObjects()
        publish(s, {"train": reward_export(12)})
        key = ("fw-datasets", "reward/ds-1/manifest.json")
        m = json.loads(s.objects[key])
        mutate(m)
        s.objects[key] = json.dumps(m).encode()
        return s

    cases = [
        (lambda m: m.update(format="parquet"), "format 'parquet' is not supported"),
        (lambda m: m.update(files=[]), "'files' must be a non-empty list"),
        (lambda m: m["files"][0].update(split="validation"), "no file with split 'train'"),
        (lambda m: m["files"][0].update(rows=11), "12 rows, the manifest says 11"),
        (lambda m: m["files"][0].update(sha256="abc"), r"files\[0\]\.sha256"),
        (lambda m: m["files"][0].update(key="reward/ds-1/gone.jsonl"), "gone.jsonl .*no such object"),
        (lambda m: m.update(bucket="Not A Bucket"), "'bucket' 'Not A Bucket' is not an S3 bucket name"),
    ]
    for mutate, problem in cases:
        with pytest.raises(DatasetError, match=problem):
            await load_dataset(manifest_case(mutate), uri)

    with pytest.raises(DatasetError, match="no such object"):
        await load_dataset(FakeObjects(), uri)
    not_json = FakeObjects()
    not_json.objects[("fw-datasets", "reward/ds-1/manifest.json")] = b"{not json"
    with pytest.raises(DatasetError, match="not JSON"):
        await load_dataset(not_json, uri)
    with pytest.raises(DatasetError, match=r"train\.jsonl \(files\[0\]\): over the dataset's size limit \(100 bytes"):
        await load_dataset(store, uri, max_bytes=100)

    bad_line = FakeObjects()
    publish(bad_line, {"train": reward_export(12)})
    key = ("fw-datasets", "reward/ds-1/train.jsonl")
    bad_line.objects[key] = bad_line.objects[key].replace(b'"P0"', b"P0", 1)
    m = json.loads(bad_line.objects[("fw-datasets", "reward/ds-1/manifest.json")])
    m["files"][0]["sha256"] = hashlib.sha256(bad_line.objects[key]).hexdigest()
    bad_line.objects[("fw-datasets", "reward/ds-1/manifest.json")] = json.dumps(m).encode()
    with pytest.raises(DatasetError, match=r"train\.jsonl line 1: not JSON"):
        await load_dataset(bad_line, uri)


async def test_other_splits_are_skipped_with_a_warning_and_bucket_defaults_to_the_manifests():
    store = FakeObjects()
    uri = publish(store, {"train": reward_export(12), "test": reward_export(2)})
    m = json.loads(store.objects[("fw-datasets", "reward/ds-1/manifest.json")])
    del m["bucket"]
    store.objects[("fw-datasets", "reward/ds-1/manifest.json")] = json.dumps(m).encode()
    loaded = await load_dataset(store, uri)
    assert len(loaded.train) == 12 and loaded.validation == []
    assert loaded.warnings == [
        "manifest file 'reward/ds-1/test.jsonl': split 'test' skipped (only train and validation are used)"
    ]


# --- check_rows ----------------------------------------------------------------------------------


def test_good_datasets_of_every_kind_pass():
    assert check_rows("dpo", dpo_rows(), dpo_rows(2)) == []
    assert check_rows("reward_model", dpo_rows(), dpo_rows(2)) == []
    assert check_rows("sft", sft_rows(), sft_rows(2)) == []
    assert check_rows("sft", [{"messages": [{"role": "user", "content": "hi"}]}] * 10, []) == [
        "no validation rows: the held-out evaluation has nothing to score"
    ]
    assert check_rows("kto", kto_rows(), kto_rows(2)) == []
    online = [{"prompt": f"p{i}", "answer": i} for i in range(10)]  # reward columns may be anything
    assert check_rows("grpo", online, online[:1]) == []
    scored = [{"prompt": f"P{i // 3}", "completion": f"R{i}", "score": i % 3} for i in range(12)]
    assert check_rows("reward_model", scored, scored[:3]) == []


@pytest.mark.parametrize(
    ("kind", "train", "validation", "problem"),
    [
        ("dpo", [], [], "no training rows"),
        ("dpo", dpo_rows(9), [], "9 training rows, at least 10 are needed"),
        ("dpo", sft_rows(), [], r"a dpo run needs the columns chosen\+prompt\+rejected"),
        ("kto", dpo_rows(), [], r"a kto run needs the columns completion\+label\+prompt"),
        ("sft", [{"question": "q", "answer": "a"}] * 10, [], "a sft run needs the columns"),
        ("reward_model", [{"prompt": "p", "completion": "c"}] * 10, [], "a reward_model run needs the columns"),
        ("dpo", [*dpo_rows()[:5], {"prompt": "p", "chosen": "c"}, *dpo_rows()[5:]], [], r"train row 5: columns differ"),
        ("dpo", dpo_rows(), [{"prompt": "p"}], r"validation row 0: columns differ .*missing \['chosen'"),
        ("dpo", [{**r, "prompt": 7} for r in dpo_rows()], [], r"train row 0: 'prompt' must be a string, got int"),
        ("dpo", [{**r, "chosen": None} for r in dpo_rows()], [], "'chosen' must be a string, got NoneType"),
        ("dpo", [{**r, "rejected": ["x"]} for r in dpo_rows()], [], "'rejected' must be a string, got list"),
        (
            "dpo",
            [*dpo_rows()[:3], {**dpo_rows()[3], "chosen": "  "}, *dpo_rows()[4:]],
            [],
            "train row 3: 'chosen' is empty",
        ),
        ("sft", [{**r, "completion": ""} for r in sft_rows()], [], "'completion' is empty"),
        ("sft", [{"messages": [{"role": "user"}]}] * 10, [], r"messages\[0\]\.content must be a string"),
        ("sft", [{"messages": []}] * 10, [], "'messages' must be a non-empty list"),
        ("kto", [{**r, "label": "yes"} for r in kto_rows()], [], "kto's 'label' must be true .* got 'yes'"),
        ("kto", [{**r, "label": 1} for r in kto_rows()], [], "kto's 'label' must be true .* got 1"),
        ("sft", [{**r, "score": math.nan} for r in sft_rows()], [], "'score' is nan"),
        ("dpo", [{**r, "chosen_score": math.inf} for r in dpo_rows()], [], "'chosen_score' is inf"),
        ("reward_model", [{**r, "margin": "big"} for r in dpo_rows()], [], "'margin' must be a number, got str"),
        ("sft", [{**r, "score": True} for r in sft_rows()], [], "'score' must be a number, got bool"),
        ("grpo", [{"prompt": ""}] * 10, [], "'prompt' is empty"),
        ("ppo", dpo_rows(), [], "kind 'ppo': must be one of"),
        (
            "reward_model",
            [{"prompt": f"P{i}", "completion": "R", "score": 1.0} for i in range(10)],
            [],
            "no pairs",
        ),
    ],
)
def test_bad_rows_are_refused_with_the_place_named(kind, train, validation, problem):
    with pytest.raises(ValueError, match=problem):
        check_rows(kind, train, validation)


def test_min_samples_is_a_parameter():
    assert check_rows("dpo", dpo_rows(3), [], min_samples=3)
    with pytest.raises(ValueError, match="3 training rows, at least 4"):
        check_rows("dpo", dpo_rows(3), [], min_samples=4)


def test_warnings_for_rows_that_train_badly():
    same = [{**r, "rejected": r["chosen"]} for r in dpo_rows()]
    assert "12 of 12 training pairs have chosen == rejected" in check_rows("dpo", same, same[:1])[0]
    all_good = [{**r, "label": True} for r in kto_rows()]
    assert check_rows("kto", all_good, all_good[:1]) == [
        "every kto label is True: KTO learns from both desirable and undesirable rows"
    ]


# --- dry run ---------------------------------------------------------------------------------------


def spec(kind: str = "dpo", **kw) -> TrainSpec:
    fields = {"kind": kind, "base_model": "tiny", "max_steps": 6, "batch_size": 2, "max_length": 64, **kw}
    if kind in ("grpo", "rloo"):
        fields["rewards"] = (RewardFunction(fn=lambda prompts, completions, **_: [0.0] * len(completions)),)
    return TrainSpec(**fields)


def test_dry_run_figures_are_measured_and_deterministic(byte_tokenizer):
    rows = dpo_rows()
    dry = estimate(spec(), rows, rows[:3], tokenizer=byte_tokenizer)
    assert dry == estimate(spec(), rows, rows[:3], tokenizer=byte_tokenizer)
    assert (dry.samples, dry.validation_samples, dry.estimated_steps) == (12, 3, 6)
    # One token per byte, +1 end of sequence: prompt (5) + chosen (4) + 1, and again with rejected.
    assert dry.mean_tokens == 20 and dry.max_tokens == 10
    assert dry.epochs == pytest.approx(6 * 2 / 12)
    assert dry.score_source == "chosen_score - rejected_score"
    margins = [0.9 - 0.1 * (i % 3) for i in range(12)]
    assert dry.score_stats["count"] == 12 and dry.score_stats["mean"] == pytest.approx(sum(margins) / 12)
    assert dry.score_stats["min"] == pytest.approx(0.7) and dry.score_stats["max"] == pytest.approx(0.9)
    assert dry.tokens_per_step == 2 * 2 * 10  # 2 pairs a step, 2 sequences of 10 tokens each
    assert dry.estimated_seconds > 0 and dry.estimated_memory_bytes == sum(dry.memory.values())
    assert dry.memory["weights"] == dry.parameters * 4  # float32 on the CPU
    assert dry.warnings == []

    longer = estimate(spec(max_steps=60), rows, [], tokenizer=byte_tokenizer)
    per_step = (longer.estimated_seconds - dry.estimated_seconds) / 54
    assert per_step > 0 and longer.estimated_seconds == pytest.approx(dry.estimated_seconds + 54 * per_step)
    assert longer.epochs == 10 and longer.warnings == []  # 10 epochs: neither too few nor too many
    wide = estimate(spec(batch_size=8), rows, [], tokenizer=byte_tokenizer)
    assert wide.memory["activations"] > dry.memory["activations"] and wide.memory["logits"] == 4 * dry.memory["logits"]
    gpu = estimate(spec(), rows, [], tokenizer=byte_tokenizer, device="cuda")
    assert gpu.device == "cuda" and gpu.memory["weights"] == dry.parameters * 2  # bf16
    assert gpu.estimated_seconds != dry.estimated_seconds


def test_dry_run_warns_about_epochs_and_truncation(byte_tokenizer):
    rows = dpo_rows(40)
    few = estimate(spec(max_steps=5), rows, [], tokenizer=byte_tokenizer)
    assert few.warnings == [
        "5 steps cover 25% of the 40 training samples once (raise max_steps or epochs to see them all)"
    ]
    many = estimate(spec(max_steps=500), rows, [], tokenizer=byte_tokenizer)
    assert many.warnings == ["500 steps go over the training samples 25 times: expect overfitting"]
    long_rows = [{**r, "chosen": "x" * 100} for r in dpo_rows(20)]
    dry = estimate(spec(max_steps=10, max_length=32), long_rows, [], tokenizer=byte_tokenizer)
    assert dry.warnings == ["20 of 20 samples are longer than max_length=32 tokens and will be truncated"]
    assert dry.max_tokens == 106  # measured before truncation, cut at 32 for the estimate
    assert dry.tokens_per_step == 2 * (32 + 10)


def test_dry_run_score_stats_per_kind(byte_tokenizer):
    sft = estimate(spec("sft"), sft_rows(), [], tokenizer=byte_tokenizer)
    assert sft.score_source == "score" and sft.score_stats["max"] == pytest.approx(0.61)
    assert sft.mean_tokens == 5 + 7 + 1
    kto = estimate(spec("kto"), kto_rows(), [], tokenizer=byte_tokenizer)
    assert kto.score_source == "label" and kto.score_stats["mean"] == pytest.approx(9 / 12)
    grpo = estimate(spec("grpo", num_generations=4, max_completion_length=16), [{"prompt": "abcd"}] * 10, [],
                    tokenizer=byte_tokenizer)  # fmt: skip
    assert grpo.score_stats == {} and grpo.score_source is None
    assert grpo.mean_tokens == 5 and grpo.tokens_per_step == 2 * 4 * (5 + 16)  # prompts x generations x length
    assert "kv_cache" in grpo.memory
    scored = [{"prompt": f"P{i // 3}", "completion": f"R{i}", "score": float(i % 3)} for i in range(12)]
    rm = estimate(spec("reward_model"), scored, [], tokenizer=byte_tokenizer)
    assert rm.samples == 12 and rm.warnings[0] == "12 scored rows make 12 chosen/rejected pairs"
    assert rm.score_source == "score" and rm.score_stats["mean"] == pytest.approx(1.0)
    assert rm.memory["logits"] < sft.memory["logits"]  # one score, not a vocabulary of logits


def test_trainable_parameters_match_peft(byte_tokenizer):
    """The count from the config on the meta device equals what PEFT really trains."""
    from peft import get_peft_model

    from flywheel.trainer.training.lora import lora_config
    from flywheel.trainer.training.models import load_for_training

    for kind in ("dpo", "reward_model"):
        s = spec(kind)
        dry = estimate(s, dpo_rows(), [], tokenizer=byte_tokenizer)
        loaded = load_for_training("tiny", reward_model=kind == "reward_model", device="cpu")
        assert dry.parameters == sum(p.numel() for p in loaded.model.parameters())
        peft_model = get_peft_model(
            loaded.model, lora_config(loaded.model, s.lora, reward_model=kind == "reward_model")
        )
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert dry.trainable_parameters == trainable, kind


def test_dry_run_reads_a_model_folder_without_weights(tmp_path, byte_tokenizer, monkeypatch):
    """A folder with only config and tokenizer files is enough: no weights are loaded."""
    from transformers import LlamaConfig, PreTrainedModel

    LlamaConfig(vocab_size=len(byte_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)  # fmt: skip
    byte_tokenizer.save_pretrained(tmp_path)

    def no_weights(*args, **kwargs):
        raise AssertionError("a dry run must not load model weights")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", no_weights)
    dry = estimate(spec("sft", base_model=str(tmp_path)), sft_rows(), [])
    assert dry.mean_tokens == 13  # the folder's (byte-level) tokenizer measured the rows
    # 3 layers x r=16 x (in + out) of q (32->32), k and v (32->16), o (32->32), gate, up (32->64), down (64->32)
    assert dry.trainable_parameters == 3 * 16 * (64 + 48 + 48 + 64 + 96 * 3)


def test_dry_run_uses_the_tiny_tokenizer_by_default():
    from flywheel.trainer.training.models import tiny_tokenizer

    rows = sft_rows()
    tok = tiny_tokenizer()
    expected = sum(len(tok(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]) + 1 for r in rows)
    assert estimate(spec("sft"), rows, []).mean_tokens == pytest.approx(expected / len(rows), abs=0.01)


def test_missing_base_model_is_named(byte_tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not 'tiny', 'smollm2', a \.gguf file or a model folder"):
        estimate(spec(base_model="/nowhere/model"), dpo_rows(), [], tokenizer=byte_tokenizer)
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        estimate(spec(base_model=str(tmp_path)), dpo_rows(), [], tokenizer=byte_tokenizer)
    with pytest.raises(ValueError, match="fetch it to a local folder first"):
        estimate(spec(base_model="s3://models/base"), dpo_rows(), [], tokenizer=byte_tokenizer)


def test_to_proto(byte_tokenizer):
    dry = estimate(spec(max_steps=2), dpo_rows(), dpo_rows(2), tokenizer=byte_tokenizer)
    report = to_proto(dry)
    assert isinstance(report, jobs_pb2.DryRunReport)
    assert (report.samples, report.validation_samples, report.estimated_steps) == (12, 2, 2)
    assert dict(report.score_stats) == pytest.approx(dry.score_stats)
    assert report.estimated_memory_bytes == dry.estimated_memory_bytes
    assert report.estimated_seconds == dry.estimated_seconds and report.mean_tokens == dry.mean_tokens
    assert list(report.warnings) == dry.warnings and report.warnings
