"""Batch optimization runs over gRPC (blocking), and reading a run config to send.

    config = load_run_file("optimization.yaml")      # test cases inlined from their file
    with RunsClient(target="127.0.0.1:50051") as runs:
        run = runs.start(config)
        for progress in runs.watch(run.run_id):     # one RunProgress per generation
            print(progress.generation, progress.best_score)
        print(runs.get(run.run_id).artifacts)

The optimizer validates the config (the schema of ``flywheel.optimizer.runconfig``, a superset
of The Convergence's optimization.yaml) and answers INVALID_ARGUMENT with one
``field.path: problem`` line per error. It cannot read the user's files, so
``load_run_file`` reads ``evaluation.test_cases.path`` (relative to the YAML's folder) and
sends the cases inline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import run_service_pb2 as rs_pb
from flywheel.api.optimizer.v1 import runs_pb2 as pb
from flywheel.api.optimizer.v1.run_service_pb2_grpc import RunServiceStub
from flywheel.sdk import _transport

__all__ = [
    "ARTIFACT_NAMES",
    "STATE_NAMES",
    "TERMINAL_STATES",
    "RunFileError",
    "RunsClient",
    "load_run_file",
    "read_test_cases",
]

ARTIFACT_NAMES = ("best_config.json", "detailed_results.json", "report.md", "report.html")
STATE_NAMES = {
    pb.RUN_STATE_UNSPECIFIED: "unspecified",
    pb.RUN_STATE_PENDING: "pending",
    pb.RUN_STATE_RUNNING: "running",
    pb.RUN_STATE_SUCCEEDED: "succeeded",
    pb.RUN_STATE_FAILED: "failed",
    pb.RUN_STATE_CANCELLED: "cancelled",
}
STATE_FROM_NAME = {name: state for state, name in STATE_NAMES.items() if state != pb.RUN_STATE_UNSPECIFIED}
TERMINAL_STATES = frozenset({pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED})


class RunFileError(ValueError):
    """A run config (or its test-case file) that cannot be read; the message names the file."""


# ---- reading the config ---------------------------------------------------------------


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise RunFileError(f"{what}: file not found: {path}") from None
    except IsADirectoryError:
        raise RunFileError(f"{what}: {path} is a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFileError(f"{what}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def read_test_cases(path: Path) -> list[Any]:
    """Test cases from a JSON file (a list, or ``{"test_cases": [...]}``) or JSONL (``.jsonl``,
    ``.ndjson``: one case per line)."""
    text = _read_text(path, "evaluation.test_cases.path")
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        cases = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                cases.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RunFileError(f"{path}: line {number} is not valid JSON: {exc.msg}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunFileError(
                f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}); "
                "use a .jsonl name for one case per line"
            ) from None
        if isinstance(data, dict) and isinstance(data.get("test_cases"), list):
            cases = data["test_cases"]
        elif isinstance(data, list):
            cases = data
        else:
            raise RunFileError(f'{path}: expected a list of test cases or {{"test_cases": [...]}}')
    if not cases:
        raise RunFileError(f"{path}: no test cases")
    return cases


def load_run_file(path: Path | str) -> dict[str, Any]:
    """Read a YAML run config; inline the cases of ``evaluation.test_cases.path`` (a JSON or
    JSONL file relative to the YAML's folder) as ``evaluation.test_cases.inline``.

    Only the file handling is checked here; the optimizer validates the schema.
    """
    path = Path(path)
    text = _read_text(path, "run config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RunFileError(f"{path}: not valid YAML: {problem}{where}") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path}: the config must be a mapping with api, search_space and evaluation")
    evaluation = data.get("evaluation")
    cases = evaluation.get("test_cases") if isinstance(evaluation, dict) else None
    if isinstance(cases, dict) and cases.get("path") is not None:
        if cases.get("inline") is not None:
            raise RunFileError(f"{path}: evaluation.test_cases: give either path or inline, not both")
        cases_path = path.parent / str(cases["path"])  # an absolute path stays absolute
        inlined = {k: v for k, v in cases.items() if k != "path"}
        inlined["inline"] = read_test_cases(cases_path)
        data = {**data, "evaluation": {**evaluation, "test_cases": inlined}}
    return data


def config_struct(config: dict[str, Any]) -> Struct:
    """The config as a protobuf Struct. YAML values JSON lacks (dates) are sent as strings."""
    struct = Struct()
    struct.update(json.loads(json.dumps(config, default=str)))
    return struct


# ---- the client -----------------------------------------------------------------------


class RunsClient(_transport.BlockingClient):
    """Blocking client for RunService. ``timeout_s`` bounds each call except ``watch``."""

    def _bind(self, channel: grpc.Channel) -> None:
        self._stub = RunServiceStub(channel)

    def start(self, config: dict[str, Any]) -> pb.Run:
        """Start a run of a config dict (``load_run_file``'s result)."""
        return self._call(self._stub.StartRun, rs_pb.StartRunRequest(config=config_struct(config))).run

    def get(self, run_id: str) -> pb.Run:
        return self._call(self._stub.GetRun, rs_pb.GetRunRequest(run_id=run_id)).run

    def cancel(self, run_id: str) -> pb.Run:
        return self._call(self._stub.CancelRun, rs_pb.CancelRunRequest(run_id=run_id)).run

    def list(self, *, limit: int = 0, state: int = pb.RUN_STATE_UNSPECIFIED) -> list[pb.Run]:
        """Runs, newest first; ``limit`` 0 is the server's default, ``state`` filters."""
        return list(self._call(self._stub.ListRuns, rs_pb.ListRunsRequest(limit=limit, state=state)).runs)  # type: ignore[arg-type]

    def artifact(self, run_id: str, name: str) -> rs_pb.GetRunArtifactResponse:
        """One result file (``ARTIFACT_NAMES``) of a run."""
        return self._call(self._stub.GetRunArtifact, rs_pb.GetRunArtifactRequest(run_id=run_id, name=name))

    def candidates(self, run_id: str, *, min_generation: int = 0) -> rs_pb.ListRunCandidatesResponse:
        """The run's history: every config it evaluated (or is evaluating) of generations >=
        ``min_generation``, ordered by generation then id, each with its origin ("search",
        "rlp", "external"...), mean score over the test cases evaluated so far (a failed one
        scores 0), cases evaluated and failed; and the run's generation now. At most 10,000
        candidates come back (the newest generations): ask with a higher ``min_generation``
        for the rest of a larger run."""
        request = rs_pb.ListRunCandidatesRequest(run_id=run_id, min_generation=min_generation)
        return self._call(self._stub.ListRunCandidates, request)

    def watch(self, run_id: str) -> Iterator[pb.RunProgress]:
        """Progress, one message per generation, until the run ends (no deadline). Closing
        the iterator (or breaking out of the loop) cancels the stream."""
        call = self._stub.WatchRun(rs_pb.WatchRunRequest(run_id=run_id), metadata=self._metadata)
        try:
            for response in call:
                yield response.progress
        finally:
            call.cancel()
