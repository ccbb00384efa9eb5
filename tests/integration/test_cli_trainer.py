"""``flywheel policies`` against a real trainer process (PostgreSQL, NATS): list, show with its
lineage, promote, rollback, the registry's refusals printed with their rule and exit code 1,
the actor and reason kept in the status history; ``flywheel train list/show`` reach the same
trainer; ``flywheel train submit --dry-run`` estimates and ``--wait`` follows a real job to its
version. Every flag and outcome is also tested against a fake TrainerService in
libs/sdk/tests/test_train_cli.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import asyncpg
import grpc
import pytest

from flywheel.api.trainer.v1 import jobs_pb2 as jobs
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.sdk import cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NAME = "cli-dpo"


def register(stub: pb_grpc.TrainerServiceStub, n: int, parent: str = "") -> jobs.Policy:
    request = pb.RegisterPolicyRequest(
        name=NAME,
        kind=jobs.TRAINING_KIND_DPO,
        base_model="tiny",
        checkpoint_uri=f"s3://checkpoints/{NAME}/{n}/adapter",
        dataset_uri=f"s3://exports/ds{n}/manifest.json",
        job_id=f"job-{n}",
        parent_policy_id=parent,
        metrics={"win_rate": 0.5 + n / 10},
        actor="test",
    )
    return stub.RegisterPolicy(request, timeout=10).policy


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI's entry point in this process (no interpreter start-up)."""
    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def test_policies_list_show_promote_rollback(launch_session, monkeypatch, capsys):
    from .trainer_jobs import warm_trainer

    # The session's trainer (one process for every test that needs a plain one); the policy
    # name is this test's alone.
    trainer = warm_trainer(launch_session)
    monkeypatch.setenv("FLYWHEEL_TRAINER_ADDRESS", trainer.address)
    monkeypatch.delenv("FLYWHEEL_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("USER", "alice")
    with grpc.insecure_channel(trainer.address) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        v1 = register(stub, 1)
        v2 = register(stub, 2, parent=v1.policy_id)
        v3 = register(stub, 3, parent=v2.policy_id)

    code, out, err = run(capsys, "policies", "list", "--name", NAME)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["POLICY_ID", "NAME", "VERSION", "STATUS", "KIND", "BASE_MODEL", "JOB", "CREATED"]
    assert [r.split()[:7] for r in rows] == [
        [p.policy_id, NAME, str(p.version), "registered", "dpo", "tiny", f"job-{p.version}"] for p in (v3, v2, v1)
    ]

    code, out, err = run(capsys, "policies", "promote", v1.policy_id, "--reason", "first")
    assert (code, out) == (0, f"{NAME} v1 ({v1.policy_id}) is active\n"), err
    code, out, err = run(capsys, "policies", "promote", v2.policy_id, "--reason", "won the canary")
    assert code == 0, err
    assert out.splitlines() == [
        f"{NAME} v2 ({v2.policy_id}) is active",
        f"{NAME} v1 ({v1.policy_id}) is retired; undo with: flywheel policies rollback {NAME}",
    ]

    # show: the status, which version is active, the lineage back to v1, the metrics
    code, out, err = run(capsys, "policies", "show", v3.policy_id)
    assert code == 0, err
    fields = dict(line.split(None, 1) for line in out.split("\n\n")[0].splitlines() if not line.startswith("base"))
    assert fields["name"] == f"{NAME} v3" and fields["status"].startswith("registered (since 20")
    assert fields["active"] == f"{NAME} v2 ({v2.policy_id})"
    assert fields["dataset"] == "s3://exports/ds3/manifest.json" and fields["job"] == "job-3"
    lineage = out.split("\n\n")[1].splitlines()
    assert lineage[0].split() == ["LINEAGE", "VERSION", "POLICY_ID", "STATUS", "JOB", "DATASET"]
    assert [line.split()[-5:-2] for line in lineage[1:]] == [
        ["3", v3.policy_id, "registered"],
        ["2", v2.policy_id, "active"],
        ["1", v1.policy_id, "retired"],
    ]
    assert "win_rate  0.8" in out.split("\n\n")[2]

    code, out, err = run(capsys, "policies", "show", v2.policy_id, "--json")
    shown = json.loads(out)
    assert (shown["version"], shown["status"], shown["metrics"]) == (2, "POLICY_STATUS_ACTIVE", {"win_rate": 0.7})
    assert [p["policy_id"] for p in shown["lineage"]] == [v1.policy_id]
    assert shown["active_version"]["policy_id"] == v2.policy_id

    code, out, err = run(capsys, "policies", "rollback", NAME, "--reason", "feedback fell")
    assert code == 0, err
    assert out.splitlines() == [
        f"{NAME} v2 ({v2.policy_id}) is rolled back",
        f"{NAME} v1 ({v1.policy_id}) is active again",
    ]

    # The registry's refusals: its message (the rule named) and exit code 1.
    code, out, err = run(capsys, "policies", "promote", v2.policy_id)
    assert code == 1 and not out
    assert err.startswith("error: FAILED_PRECONDITION: ") and "rule: no-promote-rolled-back" in err
    code, out, err = run(capsys, "policies", "rollback", NAME, "--json")
    assert code == 1 and "rule: rollback-needs-previous" in err
    code, out, err = run(capsys, "policies", "show", "0" * 32)
    assert code == 1 and err.startswith("error: NOT_FOUND: ") and "policy_id" in err
    code, out, err = run(capsys, "policies", "rollback", "no.dots")
    assert code == 1 and err.startswith("error: INVALID_ARGUMENT: ") and "name" in err

    code, out, err = run(capsys, "policies", "list", "--json")
    statuses = {p["version"]: p["status"] for p in json.loads(out) if p["name"] == NAME}
    assert statuses == {1: "POLICY_STATUS_ACTIVE", 2: "POLICY_STATUS_ROLLED_BACK", 3: "POLICY_STATUS_REGISTERED"}

    # The job commands reach the same trainer (the lead's tests train real jobs).
    code, out, err = run(capsys, "train", "list", "--state", "running", "--limit", "5")
    assert (code, out) == (0, "no jobs\n"), err
    code, out, err = run(capsys, "train", "show", "no-such-job")
    assert code == 1 and err.startswith("error: NOT_FOUND: ") and "no-such-job" in err

    # Who asked and why are in the status history.
    conn = await asyncpg.connect(
        trainer.env["FLYWHEEL_DB_URL"].replace("postgresql+asyncpg://", "postgresql://"),
        server_settings={"search_path": trainer.env["FLYWHEEL_DB_SCHEMA"]},
    )
    try:
        rows = await conn.fetch(
            "SELECT actor, reason FROM policy_history WHERE policy_id = $1 AND status = $2",
            v2.policy_id,
            jobs.POLICY_STATUS_ROLLED_BACK,
        )
    finally:
        await conn.close()
    assert [(r["actor"], r["reason"]) for r in rows] == [("cli:alice", "feedback fell")]

    # As users run it: a process of its own, the trainer found through its variable.
    env = {**os.environ, "FLYWHEEL_TRAINER_ADDRESS": trainer.address}
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "flywheel.sdk.cli", "policies", "list", "--name", NAME],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 4


async def test_train_submit_dry_run_and_wait_on_a_real_trainer(launch_session, monkeypatch, capsys):
    from .trainer_jobs import preference_rows, put_dataset, warm_trainer

    # The session's job-running trainer (torch imported once for every job test): its job list
    # is shared, so what this test submitted is what the list gained.
    trainer = warm_trainer(launch_session)
    monkeypatch.setenv("FLYWHEEL_TRAINER_ADDRESS", trainer.address)
    monkeypatch.delenv("FLYWHEEL_AUTH_TOKEN", raising=False)
    uri = put_dataset(launch_session.env, "cli", preference_rows(12), preference_rows(3, offset=30))
    common = ["train", "submit", "--kind", "dpo", "--dataset", uri, "--base-model", "tiny", "--name", "cli-dpo-job"]
    hps = ["--hp", "max_steps=3", "--hp", "batch_size=2", "--hp", "max_length=48", "--lora-r", "4"]

    def listed() -> list[dict]:
        code, out, err = run(capsys, "train", "list", "--json", "--limit", "100")
        assert code == 0, err
        return json.loads(out)

    before = listed()
    code, out, err = run(capsys, *common, *hps, "--dry-run", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["samples"], report["validation_samples"], report["estimated_steps"]) == (12, 3, 3)
    assert listed() == before  # the dry run stored nothing

    code, out, err = run(capsys, *common, *hps, "--wait", "--poll", "0.3")
    assert code == 0, err
    known = {j["job_id"] for j in before}
    (job,) = [j for j in listed() if j["job_id"] not in known]
    assert job["state"] == "JOB_STATE_SUCCEEDED" and int(job["step"]) == 3 and job["policy_id"], job
    code, out, _ = run(capsys, "policies", "show", job["policy_id"], "--json")
    assert code == 0 and json.loads(out)["job_id"] == job["job_id"]
