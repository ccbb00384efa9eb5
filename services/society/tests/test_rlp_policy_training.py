"""Training the reasoning policy on the experience buffer: at the size threshold a GRPO job
is submitted (information-gain reward on the ``outcome`` column, KL beta 0) over a dataset in
S3 that the trainer's own loader accepts for GRPO; once the job succeeded, its adapter is
loaded and the space's next steps reason with it. Real PostgreSQL and S3, a fake trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format
from sqlalchemy import select

import flywheel.society
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.db import create_engine, session_factory
from flywheel.core.migrations import upgrade
from flywheel.core.objects import ObjectStore
from flywheel.core.settings import DatabaseSettings, S3Settings
from flywheel.society.models import RlpPolicyRow
from flywheel.society.rlp.stats import rlp_stats

from .rlp_fakes import FakeRuns, FakeThinker, FakeTrainer, answer, delivery, make_service, progress, run_config

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def society_env(servers, isolation, monkeypatch) -> dict[str, str]:
    env = servers.env(**isolation)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    migrations = Path(flywheel.society.__file__).parent / "migrations"
    upgrade(DatabaseSettings(), script_location=migrations, service="society")
    return env


@pytest.fixture
async def sessions(society_env):
    engine = create_engine(DatabaseSettings())
    yield session_factory(engine)
    await engine.dispose()


async def test_grpo_job_at_the_threshold_and_the_adapter_takes_over(sessions) -> None:
    from flywheel.trainer.jobs.datasets import check_rows, load_dataset

    objects = ObjectStore(S3Settings())
    trainer = FakeTrainer()
    loaded: list[tuple[str, str]] = []

    async def load_adapter(name: str, uri: str) -> None:
        loaded.append((name, uri))

    runs = FakeRuns(run_config())
    runs.add(0, {"t": 0.2, "n": 128}, 0.3)
    think = FakeThinker(
        answer(("warm", [(0.9, 512, 0.8)]), ("cold", [(0.1, 256, 0.6)])),
        answer(("warmer", [(1.0, 512, 0.8)]), ("colder", [(0.0, 256, 0.6)])),
        answer(("x", [(0.7, 128, 0.8)]), ("y", [(0.3, 128, 0.6)])),
    )
    service = make_service(
        sessions,
        runs,
        think,
        trainer=trainer,
        objects=objects,
        rlp_train_min_experiences=2,
        rlp_train_base_model="tiny",
        load_adapter=load_adapter,
    )
    await service.on_progress(progress("run-t", 0), delivery())
    runs.add(0, {"t": 0.9, "n": 512}, 0.9, origin="rlp")
    runs.add(0, {"t": 0.1, "n": 256}, 0.2, origin="rlp")
    runs.generation = 1
    await service.on_progress(progress("run-t", 1), delivery())

    (spec,) = trainer.specs
    assert spec.kind == jobs_pb2.TRAINING_KIND_GRPO and spec.base_model == "tiny"
    assert json_format.MessageToDict(spec.hyperparameters)["beta"] == 0.0
    (reward,) = spec.rewards
    assert reward.weight == 1.0 and reward.information_gain.outcome_column == "outcome"
    assert spec.policy_name.startswith("rlp-")
    data = await load_dataset(objects, spec.dataset_uri)
    assert data.columns == {"prompt", "outcome"} and len(data.train) + len(data.validation) == 2
    assert all(r["prompt"].startswith("<|system|>") and "Observed outcome" in r["outcome"] for r in data.train)
    check_rows("grpo", data.train, data.validation, min_samples=1)  # what the trainer checks at submission
    from flywheel.core.run_policy import RunPolicySettings
    from flywheel.trainer.jobs.spec import parse_job

    job = parse_job(spec, policy=RunPolicySettings())  # the trainer's door: Invalid naming a field if refused
    assert job.kind == "grpo" and job.hyperparameters["beta"] == 0.0

    # One job at a time: the next resolution adds experiences but submits nothing while it runs.
    runs.add(1, {"t": 1.0, "n": 512}, 0.95, origin="rlp")
    runs.add(1, {"t": 0.0, "n": 256}, 0.1, origin="rlp")
    runs.generation = 2
    await service.on_progress(progress("run-t", 2), delivery())
    assert len(trainer.specs) == 1

    trainer.state = jobs_pb2.JOB_STATE_RUNNING
    assert await service.training.follow_once() == 1 and loaded == []
    trainer.state = jobs_pb2.JOB_STATE_SUCCEEDED
    assert await service.training.follow_once() == 1
    adapter = f"{spec.policy_name}-v1"
    assert loaded == [(adapter, "s3://ckpt/jobs/job-1/adapter")]
    async with sessions() as s:
        (policy,) = (await s.scalars(select(RlpPolicyRow))).all()
        stats = await rlp_stats(s, "run-t")
    assert policy.policy_model == adapter
    assert (stats.training_jobs, stats.policy_model) == (1, adapter)
    assert await service.training.follow_once() == 0  # finished jobs are not asked again

    # The space's next step reasons with the adapter (same provider prefix as the base).
    await service.on_progress(progress("run-t", 3), delivery())
    assert think.calls[-1]["model"] == f"openai/{adapter}"
    # The buffer grew by 2 since the job (4 >= 2 + 2): the next job may go.
    assert len(trainer.specs) == 2
