"""JSONL export and import (refused with the line number), the split by prompt, and the
manifest in the trace store's export format."""

from __future__ import annotations

import hashlib
import json

import pytest

from flywheel.society.sao import DatasetImportError, SaoConfig, SaoDataset, SaoRecord


def rec(i: int, prompt: str | None = None) -> SaoRecord:
    return SaoRecord(prompt or f"Question {i}?", f"good answer {i}", f"bad answer {i}", 1, "2026-11-24T08:00:00+00:00")


def test_jsonl_round_trip_keeps_the_convergence_keys(tmp_path):
    ds = SaoDataset([rec(i) for i in range(3)])
    path = ds.export_jsonl(tmp_path / "sao.jsonl")
    first = json.loads(path.read_text().splitlines()[0])
    assert {"prompt", "chosen", "rejected", "iteration", "timestamp"} <= set(first)
    back = SaoDataset.import_jsonl(path)
    assert back.records == ds.records
    # The Convergence wrote epoch seconds: accepted, stored as ISO 8601.
    old = SaoDataset.from_jsonl(json.dumps({"prompt": "p", "chosen": "c", "rejected": "r", "timestamp": 0}) + "\n")
    assert old.records[0].timestamp.startswith("1970-01-01") and old.records[0].iteration == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"prompt": "p", "chosen": "", "rejected": "r", "timestamp": "2026-01-01"}', "'chosen'"),
        ('{"prompt": "p", "chosen": "c", "rejected": "c", "timestamp": "2026-01-01"}', "same text"),
        ('{"prompt": "p", "chosen": "c", "rejected": "r", "iteration": -1, "timestamp": "2026-01-01"}', "iteration"),
        ('{"prompt": "p", "chosen": "c", "rejected": "r", "timestamp": "yesterday"}', "ISO 8601"),
        ('{"prompt": "p", "chosen": "c", "rejected": "r"}', "timestamp"),
    ],
)
def test_malformed_import_is_refused_naming_the_line(line, words):
    good = json.dumps(rec(0).to_dict())
    with pytest.raises(DatasetImportError) as err:
        SaoDataset.from_jsonl(f"{good}\n\n{good}\n{line}\n{good}\n")
    assert str(err.value).startswith("line 4:") and words in str(err.value), str(err.value)


def test_split_by_prompt_keeps_each_prompt_on_one_side():
    ds = SaoDataset([rec(i, f"Prompt {i % 10}") for i in range(40)])
    train, val = ds.split(0.2)
    assert len(train) + len(val) == 40
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    assert len({r.prompt for r in val}) == 2
    assert SaoDataset([rec(0)]).split(0.5) == ([rec(0)], [])  # at least one prompt trains


class MemoryObjects:
    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def bucket(self, purpose):
        return f"fw-{purpose}"

    async def ensure_bucket(self, purpose):
        return self.bucket(purpose)

    async def put_bytes(self, purpose, key, data, *, content_type=""):
        self.objects[key] = data
        return f"s3://{self.bucket(purpose)}/{key}"


async def test_publish_writes_the_trace_store_layout():
    store = MemoryObjects()
    ds = SaoDataset([rec(i) for i in range(20)])
    out = await ds.publish(store, validation_fraction=0.1, params=SaoConfig().model_dump(), dataset_id="sao-t1")
    assert out.manifest_uri == "s3://fw-datasets/preference/sao-t1/manifest.json"
    assert (out.train_rows, out.validation_rows, out.unique_prompts) == (18, 2, 20)
    manifest = json.loads(store.objects["preference/sao-t1/manifest.json"])
    assert manifest["kind"] == "preference" and manifest["format"] == "jsonl" and manifest["bucket"] == "fw-datasets"
    for f in manifest["files"]:
        data = store.objects[f["key"]]
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["rows"] == len(data.splitlines())
    assert [f["split"] for f in manifest["files"]] == ["train", "validation"]
    with pytest.raises(ValueError, match="dataset_id"):
        await ds.publish(store, dataset_id="../x")
    with pytest.raises(ValueError, match="no records"):
        await SaoDataset().publish(store)
