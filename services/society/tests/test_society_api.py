"""The society service's request checks, dataset ids, round summaries and training decision
(no servers: the gRPC and database paths are in tests/integration/test_society_service.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from google.protobuf.struct_pb2 import Struct

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.validation import Invalid
from flywheel.society.grpc_api import check_dataset_id, parse_config
from flywheel.society.sao.service import (
    DATASET_ID,
    SaoRounds,
    clean_json,
    dataset_token,
    new_dataset_id,
    round_id_for,
)
from flywheel.society.settings import SocietySettings
from flywheel.society.stats import summarize_rounds

ALLOWED = ["openai/local", "openai/smollm2"]


def struct(**fields: object) -> Struct:
    out = Struct()
    out.update(fields)
    return out


def test_parse_config_reads_sao_fields_and_the_model() -> None:
    config, model = parse_config(struct(n_personas=18, temperature=0.5, model="openai/smollm2"), ALLOWED)
    assert (config.n_personas, config.temperature, model) == (18, 0.5, "openai/smollm2")
    assert parse_config(Struct(), ALLOWED)[1] == "openai/local"  # the default model


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"bogus": 1}, "config.bogus"),
        ({"n_personas": "many"}, "config.n_personas"),
        ({"n_personas": 2.5}, "config.n_personas"),
        ({"temperature": 9}, "config.temperature"),
        ({"model": "openai/gpt-5"}, "config.model"),
        ({"model": 3}, "config.model"),
        ({"judge_rubric": "a\x00b"}, "config.judge_rubric"),
    ],
)
def test_parse_config_names_the_bad_field(fields: dict, field: str) -> None:
    with pytest.raises(Invalid) as err:
        parse_config(struct(**fields), ALLOWED)
    assert err.value.field == field, str(err.value)


def test_parse_config_refuses_nan() -> None:
    with pytest.raises(Invalid) as err:
        parse_config(struct(temperature=math.nan), ALLOWED)
    assert err.value.field == "config.temperature" and "finite" in str(err.value)


def test_dataset_ids() -> None:
    assert check_dataset_id("sao-run_1", required=True) == "sao-run_1"
    generated = check_dataset_id("", required=False)
    assert DATASET_ID.fullmatch(generated) and generated != new_dataset_id()
    for bad in ("", "a.b", "../x", "-lead", "x" * 65, "a\x00b", "é"):
        with pytest.raises(Invalid) as err:
            check_dataset_id(bad, required=True)
        assert err.value.field == "dataset_id"


def test_dataset_token_makes_any_name_a_dataset_id_deterministically() -> None:
    assert dataset_token("sao-run.1-g3") == "sao-run-1-g3"
    long_a, long_b = "sao-" + "r" * 80 + "-g3", "sao-" + "r" * 80 + "-g6"
    assert DATASET_ID.fullmatch(dataset_token(long_a)) and dataset_token(long_a) == dataset_token(long_a)
    assert dataset_token(long_a) != dataset_token(long_b)
    assert round_id_for("a") == round_id_for("a") != round_id_for("b")


def test_summarize_rounds_recomputes_rates_from_counts() -> None:
    rounds = [
        {
            "attempted": 18,
            "kept": 13,
            "judged": 15,
            "judge_order_agreement_rate": 13 / 15,
            "prompts_generated": 18,
            "unique_prompts": 16,
            "prompt_repetition_rate": 2 / 18,
            "dropped": {"duplicate_prompt": 2, "judge_order_disagreement": 2, "unparsable_ranking": 1},
        },
        {
            "attempted": 2,
            "kept": 0,
            "judged": 0,
            "judge_order_agreement_rate": None,  # NaN stored as null
            "prompts_generated": 0,
            "unique_prompts": 0,
            "prompt_repetition_rate": 0.0,
            "dropped": {"prompt_llm_timeout": 2},
        },
    ]
    s = summarize_rounds(rounds)
    assert (s["rounds"], s["attempted"], s["kept"], s["judged"], s["order_agreed"]) == (2, 20, 13, 15, 13)
    assert s["order_agreement_rate"] == pytest.approx(13 / 15)
    assert s["prompt_repetition_rate"] == pytest.approx(2 / 18)
    assert s["dropped"]["prompt_llm_timeout"] == 2
    assert s["dropped_fraction"] == pytest.approx(
        {
            "duplicate_prompt": 0.1,
            "judge_order_disagreement": 0.1,
            "unparsable_ranking": 0.05,
            "prompt_llm_timeout": 0.1,
        }
    )
    assert summarize_rounds([])["order_agreement_rate"] is None


def test_clean_json_turns_nan_into_null() -> None:
    assert clean_json({"a": math.nan, "b": [math.inf, 1.0], "c": {"d": "x"}}) == {
        "a": None,
        "b": [None, 1.0],
        "c": {"d": "x"},
    }


class FakeTrainer:
    def __init__(self, *, configured: bool = True, fail: bool = False) -> None:
        self.configured = configured
        self.fail = fail
        self.specs: list[jobs_pb2.TrainingJobSpec] = []

    async def submit(self, spec: jobs_pb2.TrainingJobSpec) -> object:
        if self.fail:
            raise RuntimeError("trainer at x: SubmitJob: UNAVAILABLE")
        self.specs.append(spec)
        return SimpleNamespace(job=SimpleNamespace(job_id="job-1"))


SERVERS = {
    "nats": {"url": "nats://127.0.0.1:4222"},
    "db": {"url": "postgresql+asyncpg://u:p@127.0.0.1/db"},
    "s3": {"endpoint": "127.0.0.1:9000", "access_key": "a", "secret_key": "s"},
}


def rounds_with(trainer: FakeTrainer | None, **settings: object) -> SaoRounds:
    return SaoRounds(
        settings=SocietySettings(**SERVERS, **settings),
        engine=None,  # type: ignore[arg-type]
        sessions=None,  # type: ignore[arg-type]
        publisher=None,
        catalogue=None,
        objects=None,
        llm_for=None,  # type: ignore[arg-type]
        judge=None,
        trainer=trainer,
    )


async def test_training_waits_for_the_threshold_a_base_model_and_a_trainer() -> None:
    trainer = FakeTrainer()
    base = {"sao_train_threshold": 10, "sao_train_base_model": "tiny"}
    assert await rounds_with(trainer, **base)._maybe_train("s3://d/m.json", 50, False) == ("", "not requested")
    job, note = await rounds_with(trainer, **base)._maybe_train("s3://d/m.json", 9, True)
    assert job == "" and "below the threshold of 10" in note and "SAO_TRAIN_THRESHOLD" in note
    job, note = await rounds_with(trainer, sao_train_threshold=10)._maybe_train("s3://d/m.json", 10, True)
    assert job == "" and "SAO_TRAIN_BASE_MODEL" in note
    job, note = await rounds_with(FakeTrainer(configured=False), **base)._maybe_train("s3://d/m.json", 10, True)
    assert job == "" and "TRAINER_ADDRESS" in note
    job, note = await rounds_with(FakeTrainer(fail=True), **base)._maybe_train("s3://d/m.json", 10, True)
    assert job == "" and "UNAVAILABLE" in note
    assert trainer.specs == []

    job, note = await rounds_with(trainer, **base, sao_train_kind="simpo")._maybe_train("s3://d/m.json", 10, True)
    (spec,) = trainer.specs
    assert job == "job-1" and "simpo asked" in note
    assert (spec.kind, spec.base_model, spec.dataset_uri, spec.policy_name) == (
        jobs_pb2.TRAINING_KIND_DPO,
        "tiny",
        "s3://d/m.json",
        "sao-policy",
    )
