"""RLP's information-gain reward on the CPU with the tiny random Llama: the reward equals the two
log-likelihood sums computed by hand with the adapter switched off; the door refuses what it
cannot score, naming the field; and a GRPO run (KL beta = 0, as in the paper) trains on it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from types import SimpleNamespace

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402 - after the offline switches
from google.protobuf.struct_pb2 import Struct  # noqa: E402 - after the offline switches

from flywheel.api.trainer.v1 import jobs_pb2  # noqa: E402 - after the offline switches
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb  # noqa: E402 - after the offline switches
from flywheel.core.run_policy import RunPolicySettings  # noqa: E402 - after the offline switches
from flywheel.core.validation import Invalid  # noqa: E402 - after the offline switches
from flywheel.trainer.jobs.datasets import check_reward_columns  # noqa: E402 - after the offline switches
from flywheel.trainer.jobs.spec import parse_job, placeholder_reward  # noqa: E402 - after the offline switches
from flywheel.trainer.jobs.submit import Submitter  # noqa: E402 - after the offline switches
from flywheel.trainer.training import RewardFunction, TrainSpec, train  # noqa: E402 - after the offline switches
from flywheel.trainer.training.information_gain_reward import (  # noqa: E402 - after the offline switches
    SEPARATOR,
    InformationGainReward,
)
from flywheel.trainer.training.reward_sources import (  # noqa: E402 - after the offline switches
    RewardSourceSpec,
    build_rewards,
    from_proto,
)

NOBODY = RunPolicySettings(callable_modules=[])
MANIFEST = "s3://fw-datasets/rlp/ds-1/manifest.json"


def rlp_rows(n: int = 12) -> list[dict]:
    """What an RLP dataset holds: the context as ``prompt``, the observed result as ``outcome``."""
    return [
        {
            "prompt": f"Generation {i}: temperature 0.{i % 9 + 1} scored 0.{(i * 7) % 10}. Think, then predict.",
            "outcome": f"temperature 0.{(i + 1) % 9 + 1} scored 0.{(i * 3) % 10}",
        }
        for i in range(n)
    ]


# --- the reward against a hand computation ------------------------------------------------------


@pytest.fixture(scope="module")
def policy():
    """The tiny Llama with a LoRA adapter whose B matrices are non-zero, so the adapter changes
    the outputs and scoring with it on would show."""
    import torch
    from peft import get_peft_model

    from flywheel.trainer.training.lora import lora_config
    from flywheel.trainer.training.models import load_for_training
    from flywheel.trainer.training.spec import LoraSettings

    loaded = load_for_training("tiny", device="cpu")
    model = get_peft_model(loaded.model, lora_config(loaded.model, LoraSettings(r=4, alpha=8)))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return model, loaded.tokenizer


def outcome_logprob(model, tokenizer, prefix: str, outcome: str, *, adapter: bool) -> float:
    """log p(outcome | prefix), one unpadded sequence, the full logits: the direct way."""
    import torch

    special = not prefix.startswith(tokenizer.bos_token)
    p = tokenizer(text=prefix, add_special_tokens=special)["input_ids"]
    x = tokenizer(text=outcome, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + x])
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if not adapter:
            stack.enter_context(model.disable_adapter())
        logprobs = model(input_ids=ids).logits.float().log_softmax(-1)[0]
    return sum(logprobs[len(p) + j - 1, token].item() for j, token in enumerate(x))


def test_reward_is_the_log_likelihood_difference_under_the_adapter_free_base(policy) -> None:
    model, tokenizer = policy
    chat = [{"role": "user", "content": "Scores so far: 0.41, 0.47. What comes next?"}]
    prompts = ["History: 0.5 then 0.6. Next?", chat, "Capital of France?", "Q"]
    thoughts = [
        "Scores rise by 0.1, so predict 0.7.",
        [{"role": "assistant", "content": "The trend is up; expect about 0.5.  \n"}],
        "",  # no thought: the no-think sequence itself
        "a much longer thought " * 6,
    ]
    outcomes = ["0.7", "scored 0.52", "Paris is the capital", "x y z"]
    reward = InformationGainReward(batch_size=3)  # batches of mixed lengths: padding must not matter
    reward.bind(model, tokenizer)
    got = reward(prompts=prompts, completions=thoughts, outcome=outcomes, trainer_state=None)

    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    contexts = [prompts[0], rendered, *prompts[2:]]
    texts = [thoughts[0], thoughts[1][0]["content"], thoughts[2], thoughts[3]]
    by_hand, with_adapter = [], []
    for context, thought, outcome in zip(contexts, texts, outcomes, strict=True):
        for adapter, out in ((False, by_hand), (True, with_adapter)):
            with_z = outcome_logprob(model, tokenizer, context + thought.rstrip() + SEPARATOR, outcome, adapter=adapter)
            without_z = outcome_logprob(model, tokenizer, context + SEPARATOR, outcome, adapter=adapter)
            out.append(with_z - without_z)
    assert got == pytest.approx(by_hand, abs=2e-4)
    assert got[2] == 0.0  # an empty thought: identical sequences, scored once, exactly 0
    assert all(g != 0.0 for i, g in enumerate(got) if i != 2)
    # The adapter really was off: with it on, the figures differ.
    assert max(abs(a - b) for a, b in zip(with_adapter, by_hand, strict=True)) > 1e-2
    assert model.training  # the mode is restored after scoring
    assert reward.calls == 1


def test_unbound_missing_column_and_no_lora_are_refused(policy) -> None:
    model, tokenizer = policy
    reward = InformationGainReward("result")
    with pytest.raises(RuntimeError, match="not bound"):
        reward(prompts=["p"], completions=["z"], result=["x"])
    with pytest.raises(ValueError, match="information_gain needs LoRA"):
        reward.bind(model.get_base_model(), tokenizer)
    reward.bind(model, tokenizer)
    with pytest.raises(KeyError, match="no 'result' column"):
        reward(prompts=["p"], completions=["z"], outcome=["x"])
    with pytest.raises(ValueError, match="not a column rewards receive"):
        InformationGainReward("prompt")


def test_from_proto_defaults_the_outcome_column() -> None:
    default = jobs_pb2.RewardSource(weight=2, information_gain=jobs_pb2.InformationGainReward())
    assert from_proto(default) == RewardSourceSpec(weight=2, information_gain_column="outcome")
    named = jobs_pb2.RewardSource(weight=1, information_gain=jobs_pb2.InformationGainReward(outcome_column="result"))
    assert from_proto(named).information_gain_column == "result"
    (built,) = build_rewards([from_proto(named)], judge=None, policy=NOBODY, base_model="tiny")
    assert isinstance(built.fn, InformationGainReward) and built.label == "information_gain:result"


# --- the door -----------------------------------------------------------------------------------


def job_spec(
    *, outcome_column: str = "", hyperparameters: dict | None = None, **fields: object
) -> jobs_pb2.TrainingJobSpec:
    hp = Struct()
    hp.update(hyperparameters if hyperparameters is not None else {"beta": 0.0, "max_steps": 2})
    source = jobs_pb2.RewardSource(information_gain=jobs_pb2.InformationGainReward(outcome_column=outcome_column))
    return jobs_pb2.TrainingJobSpec(
        kind=jobs_pb2.TRAINING_KIND_GRPO,
        base_model="tiny",
        dataset_uri=MANIFEST,
        hyperparameters=hp,
        rewards=[source],
        **fields,
    )


def test_parse_job_takes_information_gain_with_beta_zero() -> None:
    job = parse_job(job_spec(), policy=NOBODY)
    (source,) = job.rewards
    assert (source.outcome_column, source.request_field, source.weight) == ("outcome", "spec.rewards[0]", 1.0)
    assert job.hyperparameters["beta"] == 0
    spec = job.train_spec(samples=12, rewards=(RewardFunction(fn=placeholder_reward),))
    assert spec.beta == 0.0

    with pytest.raises(Invalid) as bad:
        parse_job(job_spec(outcome_column="prompt"), policy=NOBODY)
    assert bad.value.field == "spec.rewards[0].information_gain.outcome_column"
    with pytest.raises(Invalid) as multi:
        parse_job(job_spec(multi_turn=jobs_pb2.MultiTurn(environment="m:f", max_turns=2)), policy=NOBODY)
    assert multi.value.field == "spec.rewards[0].information_gain"
    with pytest.raises(Invalid) as negative:
        parse_job(job_spec(hyperparameters={"beta": -0.1}), policy=NOBODY)
    assert negative.value.field == "spec.hyperparameters.beta"


def test_check_reward_columns_names_the_source_split_and_row() -> None:
    job = parse_job(job_spec(outcome_column="result", reward_policy_id="rm-1"), policy=NOBODY)
    assert [s.request_field for s in job.rewards] == ["", "spec.rewards[0]"]  # the shorthand comes first
    rows = [{"prompt": r["prompt"], "result": r["outcome"]} for r in rlp_rows()]
    check_reward_columns(job.rewards, rows, rows[:2])
    field = "spec.rewards[0].information_gain.outcome_column"
    for train_rows, validation, problem in [
        (rlp_rows(), [], "train row 0 has no 'result' column"),
        (rows, [{**rows[0], "result": ""}], "validation row 0: 'result' is empty"),
        ([*rows[:3], {**rows[3], "result": 0.5}], [], "train row 3: 'result' must be text, got float"),
    ]:
        with pytest.raises(Invalid) as refused:
            check_reward_columns(job.rewards, train_rows, validation)
        assert refused.value.field == field and problem in refused.value.problem


class FakeObjects:
    """ObjectStore.get_object over a dict."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    async def get_object(self, bucket: str, key: str, *, max_bytes: int | None = None) -> bytes:
        if (bucket, key) not in self.objects:
            raise FileNotFoundError(f"s3://{bucket}/{key}: NoSuchKey")
        return self.objects[(bucket, key)]

    def publish(self, rows: list[dict]) -> None:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        self.objects[("fw-datasets", "rlp/ds-1/train.jsonl")] = data
        sha = hashlib.sha256(data).hexdigest()
        files = [{"split": "train", "key": "rlp/ds-1/train.jsonl", "rows": len(rows), "sha256": sha}]
        manifest = {"format": "jsonl", "bucket": "fw-datasets", "files": files}
        self.objects[("fw-datasets", "rlp/ds-1/manifest.json")] = json.dumps(manifest).encode()


@contextlib.asynccontextmanager
async def no_session():
    yield None  # no registry lookups: the job names no reward-model version or parent


async def test_submit_refuses_a_missing_outcome_column_naming_the_field() -> None:
    objects = FakeObjects()
    # The settings the door reads on this path (no database, bus or S3 behind it).
    settings = SimpleNamespace(policy=NOBODY, model_roots=[])
    submitter = Submitter(settings=settings, sessions=no_session, objects=objects, publisher=None, catalogue=None)
    objects.publish([{"prompt": r["prompt"], "answer": r["outcome"]} for r in rlp_rows()])
    with pytest.raises(Invalid) as missing:
        await submitter.submit(pb.SubmitJobRequest(spec=job_spec(), dry_run=True))
    assert missing.value.field == "spec.rewards[0].information_gain.outcome_column"
    assert "no 'outcome' column" in missing.value.problem
    with pytest.raises(Invalid) as wrong:
        await submitter.submit(pb.SubmitJobRequest(spec=job_spec(outcome_column="answr"), dry_run=True))
    assert wrong.value.field == "spec.rewards[0].information_gain.outcome_column"
    assert "no 'answr' column" in wrong.value.problem

    objects.publish(rlp_rows())  # prompt + outcome: accepted (a dry run: nothing stored)
    response = await submitter.submit(pb.SubmitJobRequest(spec=job_spec(), dry_run=True))
    assert response.HasField("dry_run")


# --- a GRPO run on it ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_grpo_and_rloo_train_on_information_gain_with_beta_zero(kind: str, tmp_path) -> None:
    rewards = build_rewards(
        [from_proto(jobs_pb2.RewardSource(weight=1, information_gain=jobs_pb2.InformationGainReward()))],
        judge=None,
        policy=NOBODY,
        base_model="tiny",
    )
    spec = TrainSpec(
        kind=kind,
        base_model="tiny",
        max_steps=2 if kind == "grpo" else 1,
        batch_size=2,
        max_length=64,
        learning_rate=1e-3,
        num_generations=2,
        max_completion_length=8,
        beta=0.0,
        lora={"r": 4, "alpha": 8},
        rewards=rewards,
    )
    progress = []
    result = train(spec, rlp_rows(8), tmp_path / kind, on_progress=progress.append)
    assert result.global_step == spec.max_steps
    assert rewards[0].fn.calls >= spec.max_steps  # scored every generation
    assert len(result.reward) == spec.max_steps and all(math.isfinite(r["value"]) for r in result.reward)
    assert result.groups == 2 * spec.max_steps
    assert result.flat_groups is not None and result.flat_groups < result.groups  # the thoughts differ in gain
    saved = json.loads((tmp_path / kind / "training_results.json").read_text())
    assert saved["rewards"] == [{"name": "information_gain:outcome", "weight": 1.0}]
    assert saved["spec"]["beta"] == 0.0
