"""Run outcomes that tell the truth, and The Convergence's configs running for real (issue 14),
on the real optimizer and evaluator over real NATS/PostgreSQL/S3.

- A run whose every evaluation fails (its credential variable is not set on the evaluator)
  ends FAILED: GetRun carries the count and the top error, ``flywheel optimize`` exits 1 and
  prints them, report.md and report.html show them, and the HTML report renders in headless
  Chromium (Debian's package, installed by scripts/setup.sh) with no console errors and every
  plot loaded.
- Each of the 11 Convergence 0.1.8 configs (services/optimizer/tests/convergence_configs)
  runs to SUCCEEDED against a stand-in target on loopback: only the third-party URLs, the
  credential names (to ones the run policy allows) and the custom evaluator module (to a
  Convergence-form scorer the stack's policy allows) are replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.sdk.runs import RunsClient, load_run_file
from flywheel.stack.browser import render_in_chromium

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONVERGENCE = ROOT / "services/optimizer/tests/convergence_configs"
MISSING_KEY = "FLYWHEEL_TARGET_NOT_SET_ANYWHERE"


class StandIn:
    """A loopback HTTP server answering like an OpenAI-style chat API: the reply names the
    model and repeats the request's first message, so a scorer can find the expected words."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.times: list[tuple[str, float]] = []
        seen, times = self.requests, self.times

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                seen.append((self.path, body))
                times.append((self.path, time.monotonic()))
                text = json.dumps(body.get("messages") or body.get("query") or body.get("url") or body)
                reply = {
                    "status": "completed",
                    "choices": [{"message": {"role": "assistant", "content": f"{body.get('model')}: {text}"}}],
                    "output": text,
                    "data": text,
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


def flywheel(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run(
        [sys.executable, "-m", "flywheel.sdk.cli", "--target", target, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def failing_config(url: str) -> dict[str, Any]:
    return {
        "api": {
            "name": "no-key",
            "endpoint": f"{url}/v1/chat/completions",
            "auth": {"type": "bearer", "token_env": MISSING_KEY},
        },
        "search_space": {
            "parameters": {"model": ["small", "large"], "temperature": {"type": "float", "min": 0.0, "max": 1.0}}
        },
        "evaluation": {
            "test_cases": [{"id": f"q{i}", "input": {"question": f"q {i}"}, "expected": "a"} for i in range(3)],
            "metrics": {"quality": {"type": "exact_match"}, "latency_ms": {"weight": 0.2}},
        },
        "optimization": {
            "evolution": {"population_size": 2, "generations": 2},
            "execution": {"parallel_workers": 2, "timeout_s": 10},
        },
    }


async def test_a_run_whose_evaluations_all_fail_ends_failed_and_says_why(launch, stand_in, tmp_path):
    optimizer = launch("optimizer")
    launch("evaluator")
    config_file = tmp_path / "optimization.yaml"
    config_file.write_text(yaml.safe_dump(failing_config(stand_in.url)))

    done = await asyncio.to_thread(flywheel, optimizer.address, "optimize", str(config_file))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out
    run_id = re.search(r"run (run-[0-9a-f]+)", out).group(1)
    assert re.search(r"(\d+) of \1 evaluations failed", out), out
    assert f"environment variable {MISSING_KEY}" in out
    assert "best config:" not in out  # a failed run's "best" is noise

    with RunsClient(target=optimizer.address) as runs:
        run = await asyncio.to_thread(runs.get, run_id)
        md = (await asyncio.to_thread(runs.artifact, run_id, "report.md")).content.decode()
        page = (await asyncio.to_thread(runs.artifact, run_id, "report.html")).content
    assert run.state == runs_pb2.RUN_STATE_FAILED
    assert run.evaluations_done > 0 and run.evaluations_failed == run.evaluations_done
    assert f"{MISSING_KEY} (target.http.header_envs[Authorization]) is not set on this evaluator" in (
        run.top_errors[0].message
    )
    assert run.top_errors[0].count == run.evaluations_failed
    # a key missing on the evaluator fails every candidate: the run stops at the first result
    assert run.error.startswith("the evaluator cannot run this config: environment variable " + MISSING_KEY)
    assert run.evaluations_done <= 4  # at most the first batch (2 x parallel_workers)
    assert not stand_in.requests  # nothing was sent without its key
    failed_line = f"{run.evaluations_failed} of {run.evaluations_done} evaluations failed (0 timed out)"
    for text in (md, page.decode()):
        assert failed_line in text and MISSING_KEY in text

    shown = await asyncio.to_thread(flywheel, optimizer.address, "runs", "show", run_id)
    assert shown.returncode == 0 and failed_line in shown.stdout and MISSING_KEY in shown.stdout

    # The HTML report in a real browser: it renders, shows the count and the error, logs no
    # console error, and every plot decodes.
    html_file = tmp_path / "report.html"
    html_file.write_bytes(page)
    seen = await render_in_chromium(html_file, tmp_path / "report.png")
    assert seen["errors"] == [], seen["errors"]
    assert failed_line in seen["text"] and MISSING_KEY in seen["text"]
    assert seen["images"] and all(w > 0 for w in seen["images"]), seen["images"]
    assert (tmp_path / "report.png").stat().st_size > 10_000


async def test_a_dead_url_fails_the_run_by_ratio_and_warm_start_skips_failed_runs(launch, stand_in):
    optimizer = launch("optimizer")
    launch("evaluator", env={"FLYWHEEL_EVALUATOR_RETRY_BACKOFF_S": "0.01", "FLYWHEEL_EVALUATOR_MAX_ATTEMPTS": "2"})
    dead = failing_config("http://127.0.0.1:9")  # the discard port: connection refused
    dead["api"]["auth"] = {"type": "none"}
    good = failing_config(stand_in.url)  # the same search space, a working target
    good["api"]["auth"] = {"type": "none"}
    good["evaluation"]["metrics"] = {"latency_ms": {"weight": 1.0}}
    with RunsClient(target=optimizer.address) as runs:
        failed = await asyncio.to_thread(runs.start, dead)
        failed = await until_ended(runs, failed.run_id)
        assert failed.state == runs_pb2.RUN_STATE_FAILED
        assert failed.evaluations_failed == failed.evaluations_done > 0
        assert failed.error.startswith(
            f"{failed.evaluations_failed} of {failed.evaluations_done} evaluations failed (more than "
            "optimization.execution.max_failure_ratio 0.5); most common error"
        )
        assert "127.0.0.1:9" in failed.top_errors[0].message and "ConnectError" in failed.top_errors[0].message

        ok = await until_ended(runs, (await asyncio.to_thread(runs.start, good)).run_id)
        assert ok.state == runs_pb2.RUN_STATE_SUCCEEDED and ok.evaluations_failed == 0
        first = json.loads((await asyncio.to_thread(runs.artifact, ok.run_id, "detailed_results.json")).content)
        # ...while a succeeded run on the same space is one (the check above can fail)
        again = await until_ended(runs, (await asyncio.to_thread(runs.start, good)).run_id)
        second = json.loads((await asyncio.to_thread(runs.artifact, again.run_id, "detailed_results.json")).content)
    origins = {c["origin"] for c in first["candidates"]}
    assert "warm_start" not in origins, origins  # the failed run on the same space was not a prior
    assert "warm_start" in {c["origin"] for c in second["candidates"]}


async def until_ended(runs: RunsClient, run_id: str, timeout_s: float = 120) -> runs_pb2.Run:
    async with asyncio.timeout(timeout_s):
        while True:
            run = await asyncio.to_thread(runs.get, run_id)
            if run.state != runs_pb2.RUN_STATE_RUNNING:
                return run
            await asyncio.sleep(0.5)


# -- The Convergence's configs against a stand-in ------------------------------------------------


def convergence_run(path: Path, url: str) -> dict[str, Any]:
    """``path`` as ``flywheel optimize`` sends it, pointed at the stand-in: third-party URLs
    replaced, credential names renamed to ones the run policy allows (the originals are refused:
    OPENAI_API_KEY is not under FLYWHEEL_TARGET_, AZURE_* is reserved), the custom evaluator
    module replaced by a Convergence-form scorer, and the budget cut to a few evaluations."""
    data = load_run_file(path)
    api = data["api"]
    if api.get("endpoint"):
        api["endpoint"] = f"{url}/{data['api']['name']}"
    for key, entry in (api.get("models") or {}).items():
        entry["endpoint"] = f"{url}/deployments/{key}"
    if api.get("auth", {}).get("token_env"):
        api["auth"]["token_env"] = f"FLYWHEEL_TARGET_{api['auth']['token_env']}"
    custom = data["evaluation"].get("custom_evaluator")
    if custom and custom.get("enabled", True):
        custom.update(module="flywheel.evaluator.examples", function="convergence_score")
    else:  # the web_automation template has custom metrics and no scorer: give it one
        data["evaluation"]["custom_evaluator"] = {
            "module": "flywheel.evaluator.examples",
            "function": "convergence_score",
        }
    data["evaluation"]["test_cases"]["augmentation"] = {"enabled": False}
    data["optimization"]["max_evaluations"] = 4
    if data.get("rate_limiting"):  # one request at a time, so the pacing shows in the arrival times
        data["rate_limiting"]["burst_limit"] = 1
    return data


async def test_every_convergence_config_runs_against_a_stand_in(launch, stand_in):
    configs = sorted(CONVERGENCE.rglob("*.yaml"))
    assert len(configs) == 11
    keys = {}
    for path in configs:
        env = (yaml.safe_load(path.read_text())["api"].get("auth") or {}).get("token_env")
        if env:
            keys[f"FLYWHEEL_TARGET_{env}"] = "stand-in-key"
    optimizer = launch("optimizer")
    launch("evaluator", env={**keys, "FLYWHEEL_EVALUATOR_CONCURRENCY": "8"})
    with RunsClient(target=optimizer.address) as runs:
        # The Convergence's own credential names stay refused by the run policy (issue 13).
        original = load_run_file(CONVERGENCE / "examples/azure_multi_model/azure_multi_model_optimization.yaml")
        with pytest.raises(grpc.RpcError) as refused:
            await asyncio.to_thread(runs.start, original)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "api.auth.token_env: AZURE_API_KEY" in refused.value.details()

        started = {}
        for path in configs:
            run = await asyncio.to_thread(runs.start, convergence_run(path, stand_in.url))
            started[path.parent.name] = run
        assert any(w.startswith("society.enabled:") for w in started["openai"].warnings)

        async with asyncio.timeout(240):
            while True:
                ended = {n: await asyncio.to_thread(runs.get, r.run_id) for n, r in started.items()}
                if all(r.state != runs_pb2.RUN_STATE_RUNNING for r in ended.values()):
                    break
                await asyncio.sleep(1)
    for name, run in ended.items():
        assert run.state == runs_pb2.RUN_STATE_SUCCEEDED, (name, run.error, list(run.top_errors))
        assert run.evaluations_done > 0 and run.evaluations_failed == 0, (name, list(run.top_errors))
        assert run.best_score > 0, name

    # The custom evaluator scored the custom metrics (Convergence signature), not just latency
    with RunsClient(target=optimizer.address) as runs:
        detailed = json.loads(
            (await asyncio.to_thread(runs.artifact, ended["groq"].run_id, "detailed_results.json")).content
        )
    components = [e["components"] for e in detailed["evaluations"]]
    assert components and all("response_quality" in c and "token_efficiency" in c for c in components), components
    # rate_limiting: 50 requests per minute (burst 1 here) is one request every 1.2 s
    reddit = [t for p, t in stand_in.times if p == "/agno_reddit_agent"]
    assert len(reddit) >= 3 and min(b - a for a, b in itertools.pairwise(reddit)) >= 1.0, reddit

    paths = [p for p, _ in stand_in.requests]
    bodies = [b for _, b in stand_in.requests]
    # Azure: the candidate's model picked the deployment URL
    assert {"/deployments/gpt-4.1", "/deployments/o4-mini"} & set(paths)
    # No body template: the test input merged with the params, as The Convergence sent it
    groq = [b for p, b in stand_in.requests if p == "/groq"]
    assert groq and all("messages" in b and "model" in b and "temperature" in b for b in groq)
    assert len({json.dumps(b, sort_keys=True) for b in bodies}) > 1
