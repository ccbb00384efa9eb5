"""``flywheel init / optimize / runs``: reading run files, writing configs, and the commands
against an in-process fake RunService (grpc.aio on its own thread). The real optimizer is
exercised end to end in tests/integration/test_runs.py."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import run_service_pb2 as rs_pb
from flywheel.api.optimizer.v1 import runs_pb2 as pb
from flywheel.api.optimizer.v1.run_service_pb2_grpc import RunServiceServicer, add_RunServiceServicer_to_server
from flywheel.api.ports import MODEL_SERVER_API_BASE, MODEL_SERVER_PORT
from flywheel.optimizer.runconfig import load_run_config, parse_run_config
from flywheel.sdk import cli
from flywheel.sdk.runs import ARTIFACT_NAMES, RunFileError, RunsClient, load_run_file

CAPITALS = Path(__file__).resolve().parents[3] / "services/optimizer/examples/capitals"
CASES = [{"id": "a", "input": "2+2?", "expected": "4"}, {"id": "b", "input": "3+3?", "expected": "6"}]
CONFIG = """\
api: {name: sums, kind: llm, model: openai/tiny, api_base: "http://127.0.0.1:1/v1"}
search_space:
  parameters:
    temperature: {type: float, min: 0.0, max: 1.0, step: 0.1}
evaluation:
  test_cases: {path: %s}
  metrics: {accuracy: {type: exact_match}}
"""


def _write_config(folder: Path, cases_name: str = "cases.json", cases: Any = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cases_name).write_text(json.dumps({"test_cases": CASES} if cases is None else cases))
    path = folder / "optimization.yaml"
    path.write_text(CONFIG % cases_name)
    return path


# ---- load_run_file --------------------------------------------------------------------


def test_shipped_example_is_inlined_and_the_optimizer_schema_accepts_it():
    config = load_run_file(CAPITALS / "optimization.yaml")
    cases = config["evaluation"]["test_cases"]
    assert "path" not in cases
    assert cases["inline"] == json.loads((CAPITALS / "test_cases.json").read_text())["test_cases"]
    parsed = parse_run_config(config)  # what the server does with it
    assert len(parsed.test_cases(Path("/nonexistent"))) == len(cases["inline"])


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("cases.json", json.dumps({"test_cases": CASES})),
        ("cases.json", json.dumps(CASES)),
        ("cases.jsonl", "\n".join(json.dumps(c) for c in CASES) + "\n\n"),
    ],
)
def test_test_cases_are_read_relative_to_the_yaml_not_the_cwd(tmp_path, monkeypatch, name, content):
    path = _write_config(tmp_path / "project", name)
    (path.parent / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    config = load_run_file("project/optimization.yaml")
    assert config["evaluation"]["test_cases"] == {"inline": CASES}
    assert config["api"]["name"] == "sums"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "run config: file not found: "),
        (lambda d: (d / "optimization.yaml").write_text("api: [unclosed\n"), "not valid YAML: .*line 2"),
        (lambda d: (d / "optimization.yaml").write_text("- a list\n"), "must be a mapping"),
        (lambda d: (d / "optimization.yaml").write_text(CONFIG % "missing.json"), r"file not found: .*missing\.json"),
        (lambda d: _write_config(d, "c.json", cases=[]), "c.json: no test cases"),
        (
            lambda d: _write_config(d, "c.json", cases={"cases": CASES}),
            'expected a list of test cases or {"test_cases"',
        ),
        (
            lambda d: (_write_config(d), (d / "cases.json").write_text('{"test_cases": [')),
            r"cases\.json: not valid JSON: .*line 1",
        ),
        (
            lambda d: (_write_config(d, "c.jsonl"), (d / "c.jsonl").write_text('{"input": 1}\n{oops}\n')),
            "c.jsonl: line 2 is not valid JSON",
        ),
        (
            lambda d: (d / "optimization.yaml").write_text(
                (CONFIG % "c.json").replace("{path: c.json}", "{path: c.json, inline: []}")
            ),
            "either path or inline, not both",
        ),
    ],
)
def test_unreadable_run_files_name_the_file_and_the_problem(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(RunFileError, match=message):
        load_run_file(tmp_path / "optimization.yaml")


# ---- flywheel init --------------------------------------------------------------------


def test_init_non_interactive_writes_a_config_the_optimizer_accepts(tmp_path, capsys):
    out = tmp_path / "cfg" / "optimization.yaml"
    argv = ["init", "--non-interactive", "--output", str(out), "--example-cases", "--name", "support"]
    argv += ["--temperature", "0.2,0.9", "--system-prompt", 'Say "hi": be brief.', "--system-prompt", "Be kind."]
    argv += ["--metrics", "exact_match,similarity,cost", "--generations", "3"]
    assert cli.main(argv) == 0
    config = load_run_config(out)  # also reads the example test cases it wrote
    assert config.api.name == "support" and config.api.kind == "llm" and config.api.model
    assert config.search_space.parameters["system_prompt"].values == ['Say "hi": be brief.', "Be kind."]
    temperature = config.search_space.parameters["temperature"]
    assert (temperature.min, temperature.max) == (0.2, 0.9)
    assert {n: (m.type, m.weight) for n, m in config.evaluation.metrics.items()} == {
        "accuracy": ("exact_match", 0.4),
        "similarity": ("similarity", 0.4),
        "cost_usd": ("cost", 0.2),
    }
    assert config.optimization.evolution.generations == 3
    assert len(config.test_cases(out.parent)) == 3
    assert f"flywheel optimize {out}" in capsys.readouterr().out

    assert cli.main(argv) == 1  # never overwrites without --force
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli.main([*argv, "--force", "--kind", "http", "--endpoint", "https://api.example.com/chat"]) == 0
    api = load_run_config(out).api
    assert api.kind == "http" and api.endpoint == "https://api.example.com/chat"
    assert api.request["body_template"]["input"] == "{{input}}" and api.response["path"] == "output"


def test_init_refuses_answers_the_optimizer_would_refuse(tmp_path, capsys):
    out = tmp_path / "o.yaml"
    assert cli.main(["init", "--non-interactive", "-o", str(out), "--kind", "python", "--callable", "nocolon"]) == 1
    assert "package.module:function" in capsys.readouterr().err and not out.exists()
    assert cli.main(["init", "--non-interactive", "-o", str(out), "--metrics", "bleu"]) == 1
    assert "bleu" in capsys.readouterr().err


def test_init_interactive_asks_again_after_a_bad_answer(tmp_path, monkeypatch, capsys):
    answers = iter(
        [
            "calc",  # API name
            "grpc",  # not a kind: asked again
            "python",
            "mypkg.calc:answer",
            "1,0",  # min > max: asked again
            "0,0.5",
            "You add numbers.",
            "",  # end of prompts
            "",  # test cases: default test_cases.json
            "exact_match",
            "y",  # write the example test cases
        ]
    )
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0
    config = load_run_config(tmp_path / "optimization.yaml")
    assert config.api.kind == "python" and config.api.callable == "mypkg.calc:answer"
    assert config.search_space.parameters["system_prompt"].values == ["You add numbers."]
    assert config.search_space.parameters["temperature"].max == 0.5
    assert list(config.evaluation.metrics) == ["accuracy"]
    out = capsys.readouterr().out
    assert "'grpc': use one of llm, http, python" in out and "need 0 <= MIN < MAX" in out


# ---- a fake RunService ------------------------------------------------------------------


def _struct(value: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(value)
    return s


class FakeRunService(RunServiceServicer):
    """Three generations of four evaluations, then ``final_state``."""

    def __init__(self) -> None:
        self.runs: dict[str, pb.Run] = {}
        self.configs: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        self.cancelled: list[str] = []
        self.seen_ended: set[str] = set()
        self.final_state = pb.RUN_STATE_SUCCEEDED
        self.unavailable_watches = 0  # the first N WatchRun calls fail as if the optimizer restarted
        self.evaluations_per_generation = 4  # fewer than 4 (of a budget of 4 each): racing dropped some
        self.watch_calls = 0
        self.files = {name: f"content of {name}".encode() for name in ARTIFACT_NAMES}
        self.target = ""

    def _run(self, run_id: str, context: Any) -> pb.Run:
        self.tokens.append(dict(context.invocation_metadata()).get("authorization", ""))
        if run_id not in self.runs:
            raise LookupError(run_id)
        return self.runs[run_id]

    async def StartRun(self, request, context):
        self.tokens.append(dict(context.invocation_metadata()).get("authorization", ""))
        config = json_format.MessageToDict(request.config)
        if "model" not in config.get("api", {}):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "2 problem(s):\n  - api: an llm target needs model\n  - evaluation.metrics: needs at least one metric",
            )
        self.configs.append(config)
        run_id = f"run-{len(self.runs) + 1}"
        run = pb.Run(run_id=run_id, state=pb.RUN_STATE_PENDING, config=request.config, generations_total=3)
        run.created_at.FromSeconds(1_767_225_600)
        self.runs[run_id] = run
        return rs_pb.StartRunResponse(run=run)

    async def GetRun(self, request, context):
        try:
            run = self._run(request.run_id, context)
            if run.state in (pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED):
                self.seen_ended.add(request.run_id)
            return rs_pb.GetRunResponse(run=run)
        except LookupError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.run_id!r} does not exist")

    async def ListRuns(self, request, context):
        runs = [r for r in reversed(self.runs.values()) if request.state in (0, r.state)]
        return rs_pb.ListRunsResponse(runs=runs[: request.limit or None])

    async def CancelRun(self, request, context):
        if request.run_id not in self.runs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.run_id!r} does not exist")
        run = self._run(request.run_id, context)
        # As the optimizer: an ended run stays as it was. (WatchRun runs ahead of its reader, so
        # "ended" here is what a reader saw: a terminal state returned by GetRun.)
        if request.run_id not in self.seen_ended and run.state != pb.RUN_STATE_CANCELLED:
            self.cancelled.append(request.run_id)
            run.state = pb.RUN_STATE_CANCELLED
        return rs_pb.CancelRunResponse(run=run)

    async def WatchRun(self, request, context):
        self.watch_calls += 1
        if self.watch_calls <= self.unavailable_watches:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "optimizer is restarting")
        run = self._run(request.run_id, context)
        run.state = pb.RUN_STATE_RUNNING
        best = {"temperature": 0.3, "max_tokens": 16}
        for generation in (1, 2, 3):
            run.generation, run.best_score = generation, 0.5 + 0.1 * generation
            run.best_config.CopyFrom(_struct(best))
            state = self.final_state if generation == 3 else pb.RUN_STATE_RUNNING
            if state == pb.RUN_STATE_FAILED:
                run.error = "evaluator timed out on every case"
            elif state == pb.RUN_STATE_SUCCEEDED:
                run.artifacts.update({n: f"s3://flywheel-runs/{run.run_id}/{n}" for n in ARTIFACT_NAMES})
            run.state = state
            yield rs_pb.WatchRunResponse(
                progress=pb.RunProgress(
                    run_id=run.run_id,
                    state=state,
                    generation=generation,
                    generations_total=3,
                    evaluations_done=self.evaluations_per_generation * generation,
                    evaluations_total=12,
                    best_score=run.best_score,
                    best_config=run.best_config,
                )
            )

    async def GetRunArtifact(self, request, context):
        if request.run_id not in self.runs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.run_id!r} does not exist")
        if request.name not in self.files:  # as the optimizer answers for a file not written yet
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"run has no {request.name} yet")
        return rs_pb.GetRunArtifactResponse(
            name=request.name, content=self.files[request.name], content_type="application/octet-stream"
        )

    async def ListRunCandidates(self, request, context):
        if request.min_generation < 0:
            problem = f"min_generation: must be >= 0, got {request.min_generation}"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.run_id not in self.runs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"run {request.run_id!r} does not exist")
        candidates = [
            rs_pb.RunCandidate(
                candidate_id="c-0a",
                generation=0,
                config=_struct({"temperature": 0.5, "max_tokens": 16}),
                origin="search",
                mean_score=0.25,
                cases_evaluated=2,
                cases_failed=1,
            ),
            rs_pb.RunCandidate(candidate_id="c-1r", generation=1, config=_struct({"temperature": 0.3}), origin="rlp"),
        ]
        return rs_pb.ListRunCandidatesResponse(
            candidates=[c for c in candidates if c.generation >= request.min_generation], generation=1
        )


@pytest.fixture
def fake(monkeypatch) -> Iterator[FakeRunService]:
    servicer = FakeRunService()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        add_RunServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    servicer.target = f"127.0.0.1:{port}"
    monkeypatch.setenv("FLYWHEEL_OPTIMIZER_ADDRESS", servicer.target)
    monkeypatch.setenv("FLYWHEEL_AUTH_TOKEN", "s3cret")
    monkeypatch.setattr(cli, "_WATCH_RETRIES", 3)
    monkeypatch.setattr(cli, "_WATCH_BACKOFF_S", 0.01)
    yield servicer
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


# ---- flywheel optimize ----------------------------------------------------------------


def test_optimize_shows_progress_then_the_best_config_and_the_reports(fake, tmp_path, capsys):
    path = _write_config(tmp_path)
    assert cli.main(["optimize", str(path), "--name", "sums-v2"]) == 0
    out, err = capsys.readouterr()
    # the server got the test cases inline and the bearer token
    assert fake.configs[0]["evaluation"]["test_cases"] == {"inline": CASES}
    assert fake.configs[0]["api"]["name"] == "sums-v2"
    assert set(fake.tokens) == {"Bearer s3cret"}
    assert [line for line in out.splitlines() if line.startswith("generation")] == [
        "generation 1/3: best score 0.6000 (4 evaluations)",
        "generation 2/3: best score 0.7000 (8 evaluations)",
        "generation 3/3: best score 0.8000 (12 evaluations)",
    ]
    assert "12/12" in err  # the progress bar reached the end
    assert "run run-1 succeeded after 3/3 generations: best score 0.8000" in out
    best = out.split("best config:\n", 1)[1].split("\nresults:", 1)[0]
    assert json.loads(best) == {"temperature": 0.3, "max_tokens": 16}  # 16, not 16.0
    for name in ARTIFACT_NAMES:
        assert f"s3://flywheel-runs/run-1/{name}" in out


def test_optimize_json_keeps_stdout_for_the_run(fake, tmp_path, capsys):
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--json"]) == 0
    out, err = capsys.readouterr()
    run = json.loads(out)
    assert run["state"] == "RUN_STATE_SUCCEEDED" and run["best_config"]["max_tokens"] == 16
    assert sorted(run["artifacts"]) == sorted(ARTIFACT_NAMES)
    assert "generation 3/3" in err


def test_optimize_exits_1_when_the_run_fails(fake, tmp_path, capsys):
    fake.final_state = pb.RUN_STATE_FAILED
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert "run run-1 failed after 3/3 generations" in out
    assert err.strip().splitlines()[-1] == "error: run run-1 failed: evaluator timed out on every case"


def test_optimize_prints_each_config_problem_the_server_reports(fake, tmp_path, capsys):
    path = _write_config(tmp_path)
    path.write_text(path.read_text().replace("model: openai/tiny, ", ""))
    assert cli.main(["optimize", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: INVALID_ARGUMENT: 2 problem(s):",
        "  - api: an llm target needs model",
        "  - evaluation.metrics: needs at least one metric",
    ]
    assert not fake.runs


def test_optimize_reports_a_missing_test_case_file_before_calling_the_server(fake, tmp_path, capsys):
    path = _write_config(tmp_path)
    (tmp_path / "cases.json").unlink()
    assert cli.main(["optimize", str(path)]) == 1
    assert capsys.readouterr().err == f"error: evaluation.test_cases.path: file not found: {tmp_path / 'cases.json'}\n"
    assert not fake.runs


def test_optimize_reconnects_while_the_optimizer_restarts(fake, tmp_path, capsys):
    fake.unavailable_watches = 2
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 0
    out, err = capsys.readouterr()
    assert err.count("lost the optimizer (optimizer is restarting); reconnecting") == 2
    assert "run run-1 succeeded" in out


def test_optimize_gives_up_when_the_optimizer_stays_away(fake, tmp_path, capsys):
    fake.unavailable_watches = 100
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 1
    error, hint = capsys.readouterr().err.splitlines()[-2:]
    assert error.startswith("error: UNAVAILABLE:")
    assert hint.startswith(f"hint: {fake.target} came from $FLYWHEEL_OPTIMIZER_ADDRESS")


def test_an_unreachable_optimizer_says_how_to_point_the_cli_at_the_stack(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        assert cli.main(["runs", "list", "--target", target, "--timeout", "5"]) == 1
    error, hint = capsys.readouterr().err.splitlines()
    assert error.startswith(f"error: UNAVAILABLE: optimizer at {target}:")
    assert hint.startswith(f"hint: {target} came from --target.")
    assert 'eval "$(flywheel-stack env)"' in hint and "--target HOST:PORT" in hint
    assert "Traceback" not in error


def test_optimize_no_wait_returns_the_run_id(fake, tmp_path, capsys):
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--no-wait"]) == 0
    assert capsys.readouterr().out == "run run-1 pending; follow it with: flywheel runs show run-1\n"
    assert fake.watch_calls == 0


def _interrupt_after_first_progress(monkeypatch) -> None:
    real_watch = RunsClient.watch

    def watch(self: RunsClient, run_id: str) -> Iterator[pb.RunProgress]:
        for progress in real_watch(self, run_id):
            yield progress
            raise KeyboardInterrupt

    monkeypatch.setattr(RunsClient, "watch", watch)


def test_ctrl_c_cancels_the_run_with_cancel_on_interrupt(fake, tmp_path, monkeypatch, capsys):
    _interrupt_after_first_progress(monkeypatch)
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--cancel-on-interrupt"]) == 130
    assert fake.cancelled == ["run-1"]
    assert "run run-1: cancelled" in capsys.readouterr().err


def test_ctrl_c_asks_and_leaves_the_run_going_on_no(fake, tmp_path, monkeypatch, capsys):
    _interrupt_after_first_progress(monkeypatch)
    questions: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt="": questions.append(prompt) or "n")
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 130
    assert fake.cancelled == [] and "cancel run run-1 on the optimizer?" in questions[0]
    assert "run run-1 goes on; see it with: flywheel runs show run-1" in capsys.readouterr().err


# ---- flywheel runs ----------------------------------------------------------------------


def test_runs_list_show_and_download(fake, tmp_path, capsys):
    path = _write_config(tmp_path)
    assert cli.main(["optimize", str(path), "--no-wait"]) == 0  # run-1: pending
    assert cli.main(["optimize", str(path)]) == 0  # run-2: succeeded
    capsys.readouterr()

    assert cli.main(["runs", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN_ID", "STATE", "API", "GENERATION", "BEST", "CREATED"]
    assert lines[1].split() == ["run-2", "succeeded", "sums", "3/3", "0.8000", "2026-01-01T00:00:00+00:00"]
    assert lines[2].split() == ["run-1", "pending", "sums", "0/3", "-", "2026-01-01T00:00:00+00:00"]
    assert cli.main(["runs", "list", "--state", "succeeded", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["run-2"]

    assert cli.main(["runs", "show", "run-2"]) == 0
    out = capsys.readouterr().out
    assert "state        succeeded" in out and "best score   0.8000" in out
    assert "s3://flywheel-runs/run-2/report.html" in out
    assert cli.main(["runs", "show", "run-2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best_config"] == {"temperature": 0.3, "max_tokens": 16}

    assert cli.main(["runs", "download", "run-2", "--output", str(tmp_path / "results")]) == 0
    for name in ARTIFACT_NAMES:
        assert (tmp_path / "results" / name).read_bytes() == fake.files[name]


def test_runs_candidates_lists_a_runs_history(fake, tmp_path, capsys):
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--no-wait"]) == 0
    capsys.readouterr()
    assert cli.main(["runs", "candidates", "run-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CANDIDATE", "GEN", "ORIGIN", "MEAN", "CASES", "FAILED", "CONFIG"]
    assert lines[1].split()[:6] == ["c-0a", "0", "search", "0.2500", "2", "1"]
    assert lines[1].endswith('{"max_tokens": 16, "temperature": 0.5}')
    assert lines[2].split()[:6] == ["c-1r", "1", "rlp", "-", "0", "0"]  # nothing evaluated yet

    assert cli.main(["runs", "candidates", "run-1", "--json", "--min-generation", "1"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == {
        "generation": 1,
        "candidates": [
            {
                "candidate_id": "c-1r",
                "generation": 1,
                "config": {"temperature": 0.3},
                "origin": "rlp",
                "mean_score": 0.0,
                "cases_evaluated": 0,
                "cases_failed": 0,
            }
        ],
    }
    assert cli.main(["runs", "candidates", "run-1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["candidates"][0]
    # numbers stay numbers: an integral config value is an int, counts are ints
    assert first["config"]["max_tokens"] == 16 and isinstance(first["config"]["max_tokens"], int)
    assert isinstance(first["cases_evaluated"], int) and first["mean_score"] == 0.25

    with RunsClient(target=fake.target) as runs:
        history = runs.candidates("run-1", min_generation=1)
    assert [c.candidate_id for c in history.candidates] == ["c-1r"] and history.generation == 1

    assert cli.main(["runs", "candidates", "nope"]) == 1
    assert capsys.readouterr().err == "error: NOT_FOUND: run 'nope' does not exist\n"
    assert cli.main(["runs", "candidates", "run-1", "--min-generation", "-1"]) == 1
    assert "min_generation: must be >= 0" in capsys.readouterr().err


def test_runs_download_says_which_files_are_missing(fake, tmp_path, capsys):
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--no-wait"]) == 0
    del fake.files["report.html"], fake.files["report.md"]
    capsys.readouterr()
    assert cli.main(["runs", "download", "run-1", "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == ("error: run run-1 (pending) has no report.md, report.html; results are written when the run ends\n")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["best_config.json", "detailed_results.json"]


def test_runs_show_of_an_unknown_run_is_one_error_line(fake, capsys):
    assert cli.main(["runs", "show", "nope"]) == 1
    assert capsys.readouterr().err == "error: NOT_FOUND: run 'nope' does not exist\n"


def test_runs_cancel_stops_a_running_run_and_refuses_an_ended_one(fake, tmp_path, capsys):
    assert cli.main(["optimize", str(_write_config(tmp_path)), "--no-wait"]) == 0
    fake.runs["run-1"].state = pb.RUN_STATE_RUNNING
    fake.runs["run-1"].generation = 2
    capsys.readouterr()
    assert cli.main(["runs", "cancel", "run-1"]) == 0
    assert capsys.readouterr().out == "run run-1 cancelled after 2/3 generations\n"
    assert fake.cancelled == ["run-1"] and fake.runs["run-1"].state == pb.RUN_STATE_CANCELLED
    assert cli.main(["runs", "cancel", "run-1"]) == 0  # a retried cancel: already done, fine
    assert capsys.readouterr().out == "run run-1 cancelled after 2/3 generations\n"
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 0  # run-2 succeeds
    capsys.readouterr()
    assert cli.main(["runs", "cancel", "run-2"]) == 1  # ended: nothing to stop
    assert capsys.readouterr().err == "error: run run-2 is succeeded: only a running run can be cancelled\n"
    assert fake.cancelled == ["run-1"]
    assert cli.main(["runs", "cancel", "nope"]) == 1
    assert capsys.readouterr().err == "error: NOT_FOUND: run 'nope' does not exist\n"


def test_the_progress_bar_ends_at_100_percent_when_racing_needed_fewer_evaluations(fake, tmp_path, capsys):
    fake.evaluations_per_generation = 3  # 9 of the 12 budgeted: racing dropped 3
    assert cli.main(["optimize", str(_write_config(tmp_path))]) == 0
    out, err = capsys.readouterr()
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "100%" in final and "9/9" in final, final
    assert "done: 9 evaluations (3 of the 12 budgeted were not needed" in out


def test_a_closed_stdout_ends_quietly_with_exit_code_141(fake, tmp_path):
    path = _write_config(tmp_path)
    for _ in range(3):
        assert cli.main(["optimize", str(path), "--no-wait"]) == 0
    # `flywheel runs list | head -0`: the reader is gone before the CLI writes its first line
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel.sdk.cli", "runs", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
    )
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == cli.BROKEN_PIPE_EXIT
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


def test_init_defaults_to_the_local_model_server_and_asks_for_max_tokens(tmp_path, capsys):
    from flywheel.optimizer.runs.requests import RequestTemplate

    assert f":{MODEL_SERVER_PORT}/" in MODEL_SERVER_API_BASE  # one port: the model server's default
    out = tmp_path / "optimization.yaml"
    argv = ["init", "--non-interactive", "-o", str(out), "--example-cases", "--max-tokens", "64,256"]
    assert cli.main(argv) == 0
    config = load_run_config(out)
    assert config.api.api_base == MODEL_SERVER_API_BASE and config.api.auth.type == "none"
    tokens = config.search_space.parameters["max_tokens"]
    assert tokens.type == "discrete" and tokens.values == [64, 256]
    # What the evaluator gets: the local server's URL and no key variable, for which it sends a
    # placeholder key (services/evaluator targets.call_llm) instead of failing for lack of one.
    sent = parse_run_config(load_run_file(out))  # as `flywheel optimize` sends it: cases inline
    target = RequestTemplate.of("run-x", sent).target.llm
    assert target.api_base == MODEL_SERVER_API_BASE and target.api_key_env == ""

    # The provider's own API needs a key: init asks for the variable, and writes it as bearer auth.
    base = ["init", "--non-interactive", "-o", str(out), "--force", "--api-base", "", "--model", "openai/gpt-4o-mini"]
    capsys.readouterr()
    assert cli.main(base) == 1
    assert "needs a key" in capsys.readouterr().err
    assert cli.main([*base, "--key-env", "FLYWHEEL_TARGET_OPENAI_API_KEY", "--max-tokens", "128"]) == 0
    config = load_run_config(out)
    assert config.api.auth.type == "bearer" and config.api.auth.token_env == "FLYWHEEL_TARGET_OPENAI_API_KEY"
    assert config.search_space.parameters["max_tokens"].values == [128]
    with pytest.raises(SystemExit) as refused:  # argparse refuses it before anything is written
        cli.main([*base, "--key-env", "FLYWHEEL_TARGET_KEY", "--max-tokens", "0"])
    assert refused.value.code == 2 and "whole numbers >= 1" in capsys.readouterr().err


def test_init_interactive_llm_asks_for_the_key_variable_and_max_tokens(tmp_path, monkeypatch, capsys):
    answers = iter(
        [
            "chat",  # API name
            "",  # kind: llm
            "openai/gpt-4o-mini",
            "",  # api_base: the local model server's
            "",  # key variable: none for the local server
            "",  # temperature
            "64,x",  # not numbers: asked again
            "64,128",
            "",  # no prompts: the defaults
            "",  # test cases
            "",  # metrics
            "y",  # write the example test cases
        ]
    )
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0
    config = load_run_config(tmp_path / "optimization.yaml")
    assert config.api.api_base == MODEL_SERVER_API_BASE and config.api.auth.type == "none"
    assert config.search_space.parameters["max_tokens"].values == [64, 128]
    assert "'64,x' is not a whole number" in capsys.readouterr().out
