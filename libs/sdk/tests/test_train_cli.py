"""``flywheel train``: the text forms of rewards and hyperparameters, the flags' checks, and the
commands against an in-process fake TrainerService (grpc.aio on its own thread) with canned
answers. The policy commands run against the real trainer in
tests/integration/test_cli_trainer.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1.trainer_service_pb2_grpc import (
    TrainerServiceServicer,
    add_TrainerServiceServicer_to_server,
)
from flywheel.sdk import cli, cli_train
from flywheel.sdk.cli_common import TRAINER, connection
from flywheel.sdk.trainer import describe_reward, parse_hyperparameter, parse_reward, parse_verifiable

SUBMIT = ["train", "submit", "--kind", "dpo", "--dataset", "s3://exports/ds1/manifest.json", "--base-model", "tiny"]

# ---- text forms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("judge", jobs.RewardSource(weight=1, judge=jobs.JudgeReward())),
        (
            "judge:rubric=helpful:rank:weight=0.5",
            jobs.RewardSource(weight=0.5, judge=jobs.JudgeReward(rubric="helpful", rank=True)),
        ),
        ("reward_model:pol-1", jobs.RewardSource(weight=1, reward_policy_id="pol-1")),
        (
            "exact_match:answer:weight=2",
            jobs.RewardSource(weight=2, verifiable=jobs.VerifiableReward(exact_match_column="answer")),
        ),
        (
            "callable:my.pkg.rewards:length_penalty:weight=-0.1",
            jobs.RewardSource(weight=-0.1, verifiable=jobs.VerifiableReward(callable="my.pkg.rewards:length_penalty")),
        ),
    ],
)
def test_rewards_parse_from_text_and_describe_back(text, expected):
    source = parse_reward(text)
    assert source == expected
    assert parse_reward(describe_reward(source)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("judge:strict", "unknown judge option 'strict'"),
        ("reward_model:", "expected reward_model:POLICY_ID"),
        ("callable:no_function", "expected exact_match:COLUMN or callable:MODULE:FUNCTION"),
        ("exact_match:", "expected exact_match:COLUMN"),
        ("bleu:answer", "expected judge"),
        ("judge:weight=0", "weight '0' is not a non-zero finite number"),
        ("exact_match:a:weight=heavy", "weight 'heavy'"),
    ],
)
def test_bad_rewards_name_the_reward_and_the_problem(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_reward(text)
    assert repr(text) in str(err.value)


def test_eval_metrics_are_exact_match_or_callable():
    assert parse_verifiable("exact_match:answer").exact_match_column == "answer"
    assert parse_verifiable("callable:m.n:f").callable == "m.n:f"
    with pytest.raises(ValueError, match="metric 'judge'"):
        parse_verifiable("judge")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("learning_rate=1e-5", ("learning_rate", 1e-5)),
        ("max_steps=3", ("max_steps", 3)),
        ("beta=0.1", ("beta", 0.1)),
        ("bf16=True", ("bf16", True)),
        ("packing=false", ("packing", False)),
        ("optim=adamw_torch", ("optim", "adamw_torch")),
        (" warmup = 10 ", ("warmup", 10)),
    ],
)
def test_hyperparameters_are_numbers_and_bools_when_they_look_like_them(text, expected):
    key, value = parse_hyperparameter(text)
    assert (key, value) == expected and type(value) is type(expected[1])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("=3", "expected KEY=VALUE"),
        ("lr", "expected KEY=VALUE"),
        ("lr=nan", "lr: 'nan' is not a finite"),
        ("n=" + "9" * 17, "2\\*\\*53"),
    ],
)
def test_bad_hyperparameters_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_hyperparameter(text)


def test_the_trainer_address_defaults_to_its_port_and_variable(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_TRAINER_ADDRESS", raising=False)
    args = argparse.Namespace(service=TRAINER)
    assert connection(args)["target"] == "127.0.0.1:50056"
    monkeypatch.setenv("FLYWHEEL_TRAINER_ADDRESS", "trainer.internal:9")
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", "optimizer.internal:9")
    assert connection(args)["target"] == "trainer.internal:9"
    assert connection(argparse.Namespace())["target"] == "optimizer.internal:9"  # other commands: the optimizer


# ---- a fake trainer -------------------------------------------------------------------


def _job(job_id: str, state: int, step: int = 0, **extra: Any) -> jobs.TrainingJob:
    spec = jobs.TrainingJobSpec(kind=jobs.TRAINING_KIND_DPO, base_model="tiny", dataset_uri="s3://exports/ds1/m.json")
    return jobs.TrainingJob(job_id=job_id, spec=spec, state=state, step=step, total_steps=3, **extra)


class FakeTrainer(TrainerServiceServicer):
    def __init__(self) -> None:
        self.target = ""
        self.submitted: list[pb.SubmitJobRequest] = []
        self.list_requests: list[pb.ListJobsRequest] = []
        self.cancelled: list[str] = []
        self.tokens: list[str] = []
        self.final = _job(
            "job-1", jobs.JOB_STATE_SUCCEEDED, 3, policy_id="pol-9", metrics={"loss": 0.25, "win_rate": 0.75}
        )
        self.unavailable_polls = 0
        self.unimplemented = False
        self.polls = 0

    def _seen(self, context: grpc.aio.ServicerContext) -> None:
        self.tokens += [v for k, v in context.invocation_metadata() if k == "authorization"]

    async def SubmitJob(self, request, context):
        self._seen(context)
        if self.unimplemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "SubmitJob: training jobs are not implemented yet")
        if request.spec.dataset_uri.endswith("missing.json"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec.dataset_uri: no manifest at that URI")
        self.submitted.append(request)
        if request.dry_run:
            report = jobs.DryRunReport(
                samples=1200,
                validation_samples=120,
                score_stats={"count": 1200, "mean": 0.42, "std": 0.1, "min": 0, "max": 1},
                estimated_steps=150,
                estimated_seconds=750,
                estimated_memory_bytes=3 * 2**30,
                mean_tokens=312.4,
                warnings=["40 samples longer than max_length are cut"],
            )
            return pb.SubmitJobResponse(dry_run=report)
        return pb.SubmitJobResponse(job=_job("job-1", jobs.JOB_STATE_QUEUED))

    async def GetJob(self, request, context):
        self._seen(context)
        if request.job_id != "job-1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}")
        if self.unavailable_polls:
            self.unavailable_polls -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "trainer is restarting")
        self.polls += 1
        script = [
            _job("job-1", jobs.JOB_STATE_QUEUED),
            _job("job-1", jobs.JOB_STATE_RUNNING, 1, worker="gpu-0", attempts=1, metrics={"loss": 0.7}),
            _job(
                "job-1",
                jobs.JOB_STATE_RUNNING,
                2,
                worker="gpu-1",
                attempts=2,
                metrics={"loss": 0.5, "flat_groups": 1, "groups": 4, "eta_s": 75},
            ),
        ]
        return pb.GetJobResponse(job=script[self.polls - 1] if self.polls <= len(script) else self.final)

    async def ListJobs(self, request, context):
        self.list_requests.append(request)
        return pb.ListJobsResponse(
            jobs=[
                _job("job-2", jobs.JOB_STATE_RUNNING, 1),
                _job("job-1", jobs.JOB_STATE_SUCCEEDED, 3, policy_id="pol-9"),
            ]
        )

    async def CancelJob(self, request, context):
        self.cancelled.append(request.job_id)
        if request.job_id == "done":
            return pb.CancelJobResponse(job=_job("done", jobs.JOB_STATE_SUCCEEDED, 3))
        return pb.CancelJobResponse(job=_job(request.job_id, jobs.JOB_STATE_RUNNING, 2, cancel_requested=True))


@pytest.fixture
def fake(monkeypatch) -> Iterator[FakeTrainer]:
    servicer = FakeTrainer()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        add_TrainerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    servicer.target = f"127.0.0.1:{port}"
    monkeypatch.setenv("FLYWHEEL_TRAINER_ADDRESS", servicer.target)
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", "127.0.0.1:1")  # never used by these commands
    monkeypatch.setenv("FLYWHEEL_AUTH_TOKEN", "s3cret")
    monkeypatch.setattr(cli_train, "_POLL_BACKOFF_S", 0.01)
    yield servicer
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


# ---- submit ---------------------------------------------------------------------------


def test_dry_run_sends_the_whole_spec_and_prints_the_report(fake, capsys):
    argv = [
        *SUBMIT[:3],
        "grpo",
        *SUBMIT[4:],
        "--name",
        "support-bot",
        "--endpoint",
        "support-bot",
        "--lora-r",
        "8",
        "--lora-alpha",
        "16",
        "--lora-dropout",
        "0",
        "--hp",
        "learning_rate=1e-5",
        "max_steps=3",
        "--hp",
        "bf16=true",
        "--reward",
        "judge:rubric=default",
        "--reward",
        "exact_match:answer:weight=0.5",
        "--eval-metric",
        "exact_match:answer",
        "--dry-run",
    ]
    assert cli.main(argv) == 0
    (request,) = fake.submitted
    assert request.dry_run and set(fake.tokens) == {"Bearer s3cret"}
    spec = request.spec
    assert (spec.kind, spec.base_model, spec.dataset_uri) == (jobs.TRAINING_KIND_GRPO, "tiny", SUBMIT[5])
    assert (spec.policy_name, spec.endpoint) == ("support-bot", "support-bot")
    assert (spec.lora.r, spec.lora.alpha, spec.lora.dropout) == (8, 16, 0.0)
    hp = dict(spec.hyperparameters.items())
    assert hp == {"learning_rate": 1e-5, "max_steps": 3, "bf16": True}
    assert [describe_reward(r) for r in spec.rewards] == ["judge:rubric=default", "exact_match:answer:weight=0.5"]
    assert spec.eval_metrics[0].exact_match_column == "answer"
    out = capsys.readouterr().out
    assert out.startswith("dry run of a grpo job on s3://exports/ds1/manifest.json: nothing stored, queued or trained")
    assert "samples                 1200" in out
    assert "estimated time          12m 30s" in out and "estimated memory        3.0 GiB" in out
    assert "SCORES  COUNT  MEAN  STD  MIN  MAX" in out and "1200   0.42" in out
    assert out.rstrip().endswith("warning: 40 samples longer than max_length are cut")


def test_dry_run_json(fake, capsys):
    assert cli.main([*SUBMIT, "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 1200 and report["estimated_steps"] == 150 and report["mean_tokens"] == 312.4


def test_submit_prints_the_job_id_alone_on_stdout(fake, capsys):
    assert cli.main(SUBMIT) == 0
    out, err = capsys.readouterr()
    assert out == "job-1\n"
    assert "follow it with: flywheel train show job-1" in err
    spec = fake.submitted[0].spec
    assert not fake.submitted[0].dry_run and (spec.lora.r, spec.lora.alpha, spec.lora.dropout) == (16, 32, 0.05)


def test_wait_follows_the_job_to_its_policy(fake, capsys):
    assert cli.main([*SUBMIT, "--wait", "--poll", "0.01"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("job job-1 ")] == [
        "job job-1 queued (Ctrl-C to stop watching)",
        "job job-1 running on gpu-0",
        "job job-1 succeeded after 3/3 steps: policy pol-9",
    ]
    assert "job job-1: attempt 2 (it resumes from its last checkpoint)" in lines
    assert "win_rate  0.75" in out
    assert "make it active with: flywheel policies promote pol-9" in out
    assert "3/3" in err  # the bar reached the end
    assert "loss 0.5, flat groups 1/4, eta 1m 15s" in err  # and showed the trainer's figures


def test_wait_exits_1_when_the_job_fails(fake, capsys):
    fake.final = _job("job-1", jobs.JOB_STATE_FAILED, 2, error="CUDA out of memory\nat step 2")
    assert cli.main([*SUBMIT, "--wait", "--poll", "0.01", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["state"] == "JOB_STATE_FAILED"
    assert err.splitlines()[-1] == "error: job job-1 failed: CUDA out of memory at step 2"


def test_wait_exits_1_when_the_job_is_cancelled(fake, capsys):
    fake.final = _job("job-1", jobs.JOB_STATE_CANCELLED, 2, checkpoint_uri="s3://ckpt/job-1/2")
    assert cli.main([*SUBMIT, "--wait", "--poll", "0.01"]) == 1
    out, err = capsys.readouterr()
    assert "last checkpoint: s3://ckpt/job-1/2" in out
    assert err.splitlines()[-1] == "error: job job-1 was cancelled at step 2/3"


def test_wait_retries_while_the_trainer_restarts(fake, capsys):
    fake.unavailable_polls = 2
    assert cli.main([*SUBMIT, "--wait", "--poll", "0.01"]) == 0
    out, err = capsys.readouterr()
    assert err.count("lost the trainer (trainer is restarting); retrying") == 2
    assert "succeeded after 3/3 steps" in out


def test_wait_gives_up_when_the_trainer_stays_away(fake, capsys):
    fake.unavailable_polls = 100
    assert cli.main([*SUBMIT, "--wait", "--poll", "0.01"]) == 1
    error, hint = capsys.readouterr().err.splitlines()[-2:]
    assert error == f"error: UNAVAILABLE: trainer at {fake.target}: trainer is restarting"
    assert hint.startswith(f"hint: {fake.target} came from $FLYWHEEL_TRAINER_ADDRESS")


def test_the_servers_errors_are_printed_as_sent(fake, capsys):
    assert cli.main([*SUBMIT[:5], "s3://x/missing.json", *SUBMIT[6:]]) == 1
    assert capsys.readouterr().err == "error: INVALID_ARGUMENT: spec.dataset_uri: no manifest at that URI\n"
    fake.unimplemented = True
    assert cli.main(SUBMIT) == 1
    assert capsys.readouterr().err == "error: UNIMPLEMENTED: SubmitJob: training jobs are not implemented yet\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kind", "grpo"], "error: --kind grpo needs at least one --reward (judge[:rubric=NAME]"),
        (["--reward", "judge"], "error: --reward: only grpo and rloo take rewards, not dpo"),
        (["--hp", "lr=1", "--hp", "lr=2"], "error: --hp lr is given twice"),
        (["--name", "support.bot"], "error: --name 'support.bot' must be 1-64 chars of [A-Za-z0-9_-]"),
        (["--environment", "envs:chat"], "error: --environment: only grpo trains over several turns, not dpo"),
        (["--max-turns", "3"], "error: --max-turns needs --environment"),
        (["--canary-cap", "0.2"], "error: --canary-cap needs --endpoint"),
        (["--dataset", " "], "error: --dataset is empty"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_before_calling(fake, capsys, extra, message):
    assert cli.main([*SUBMIT, *extra]) == 1
    assert capsys.readouterr().err.startswith(message)
    assert not fake.submitted


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--reward", "bleu:x"], "argument --reward: reward 'bleu:x': expected judge"),
        (["--hp", "lr"], "argument --hp: hyperparameter 'lr': expected KEY=VALUE"),
        (["--eval-metric", "judge"], "argument --eval-metric: metric 'judge'"),
        (["--lora-r", "0"], "argument --lora-r: '0' is not a whole number of at least 1"),
        (["--lora-dropout", "1"], "argument --lora-dropout: '1' is not a dropout in [0, 1)"),
        (["--kind", "ppo"], "argument --kind: invalid choice: 'ppo'"),
        (["--dry-run", "--wait"], "argument --wait: not allowed with argument --dry-run"),
    ],
)
def test_unreadable_flags_are_usage_errors_naming_the_flag(fake, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*SUBMIT, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not fake.submitted


# ---- list, show, cancel ---------------------------------------------------------------


def test_list_filters_by_state_and_prints_a_table(fake, capsys):
    assert cli.main(["train", "list", "--state", "running", "--limit", "5"]) == 0
    request = fake.list_requests[0]
    assert (request.state, request.limit) == (jobs.JOB_STATE_RUNNING, 5)
    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split() == ["JOB_ID", "STATE", "KIND", "NAME", "STEP", "POLICY", "CREATED"]
    assert first.split() == ["job-2", "running", "dpo", "-", "1/3", "-", "-"]
    assert second.split()[:6] == ["job-1", "succeeded", "dpo", "-", "3/3", "pol-9"]
    assert cli.main(["train", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in listed] == ["job-2", "job-1"] and listed[1]["total_steps"] == 3


def test_show_prints_the_spec_progress_and_metrics(fake, capsys):
    fake.polls = 10  # past the script: the finished job
    assert cli.main(["train", "show", "job-1"]) == 0
    out = capsys.readouterr().out
    assert "state       succeeded" in out and "policy      pol-9" in out and "step        3/3" in out
    assert "loss      0.25" in out
    assert cli.main(["train", "show", "job-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy_id"] == "pol-9"
    assert cli.main(["train", "show", "nope"]) == 1
    assert capsys.readouterr().err == "error: NOT_FOUND: job_id: no job 'nope'\n"


def test_cancel_says_a_running_job_stops_at_its_next_step(fake, capsys):
    assert cli.main(["train", "cancel", "job-1"]) == 0
    assert capsys.readouterr().out == (
        "job job-1 cancel requested at step 2/3; it stops at its next step and keeps its last checkpoint\n"
    )
    assert cli.main(["train", "cancel", "done"]) == 1
    assert capsys.readouterr().err == "error: job done is succeeded: only a queued or running job can be cancelled\n"
    assert fake.cancelled == ["job-1", "done"]


def test_an_unreachable_trainer_says_where_the_address_came_from(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        assert cli.main(["policies", "list", "--target", target, "--timeout", "5"]) == 1
    error, hint = capsys.readouterr().err.splitlines()
    assert error.startswith(f"error: UNAVAILABLE: trainer at {target}:")
    assert hint.startswith(f"hint: {target} came from --target.") and "for a remote trainer" in hint
