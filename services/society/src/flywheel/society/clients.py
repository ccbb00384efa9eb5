"""The services the society calls over gRPC: the optimizer (a run's config and history) and
the trainer (preference and GRPO jobs, the policies they register). The reward judge is
``flywheel.core.judge_client.JudgeClient``.

Each call has the link's timeout and is retried on UNAVAILABLE / DEADLINE_EXCEEDED a few
times; anything else is raised as :class:`LinkError` naming the service and the status."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import json_format

from flywheel.api.optimizer.v1 import run_service_pb2 as runs_pb
from flywheel.api.optimizer.v1 import run_service_pb2_grpc as runs_grpc
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.tls import aio_channel
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.api.trainer.v1 import trainer_service_pb2 as trainer_pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as trainer_grpc
from flywheel.society.settings import SocietySettings

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class LinkError(Exception):
    """A call to another service failed (or the link is not configured)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class _Link:
    """One lazily opened channel per event loop, bearer token and TLS from the settings."""

    def __init__(self, settings: SocietySettings, link: str, stub_cls: type, *, attempts: int = 3) -> None:
        self._name = link
        self._address = getattr(settings, f"{link}_address")
        self._setting = type(settings).env_var(f"{link}_address")
        self._tls = settings.link_tls(link)
        token = settings.link_token(link)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout_s = float(getattr(settings, f"{link}_timeout_s"))
        self._stub_cls = stub_cls
        self._attempts = attempts
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def configured(self) -> bool:
        return bool(self._address)

    async def call(self, method: str, request: Any, *, timeout_s: float | None = None) -> Any:
        if not self._address:
            raise LinkError(f"no {self._name} configured (set {self._setting})")
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            self._channel = aio_channel(self._address, self._tls)
            self._stub = self._stub_cls(self._channel)
            self._loop = loop
        for attempt in range(1, self._attempts + 1):
            try:
                return await getattr(self._stub, method)(
                    request, timeout=timeout_s or self._timeout_s, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSIENT and attempt < self._attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise LinkError(
                    f"{self._name} at {self._address}: {method}: {exc.code().name}: {exc.details()}", exc.code()
                ) from None
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


class OptimizerRuns:
    """A batch run's config and history, from the optimizer's RunService."""

    def __init__(self, settings: SocietySettings) -> None:
        self._link = _Link(settings, "optimizer", runs_grpc.RunServiceStub)

    @property
    def configured(self) -> bool:
        return self._link.configured

    async def get_run(self, run_id: str) -> runs_pb2.Run:
        got = await self._link.call("GetRun", runs_pb.GetRunRequest(run_id=run_id))
        return got.run

    async def run_config(self, run_id: str) -> dict[str, Any]:
        """The run's configuration as the YAML gave it (JSON types)."""
        return json_format.MessageToDict((await self.get_run(run_id)).config)

    async def candidates(self, run_id: str, *, min_generation: int = 0) -> tuple[list[dict[str, Any]], int]:
        """(candidates, the run's current generation); each candidate is a dict with
        ``candidate_id``, ``generation``, ``params``, ``origin``, ``score`` (mean so far),
        ``cases`` and ``failed``."""
        got = await self._link.call(
            "ListRunCandidates", runs_pb.ListRunCandidatesRequest(run_id=run_id, min_generation=min_generation)
        )
        rows = [
            {
                "candidate_id": c.candidate_id,
                "generation": c.generation,
                "params": json_format.MessageToDict(c.config),
                "origin": c.origin,
                "score": c.mean_score,
                "cases": c.cases_evaluated,
                "failed": c.cases_failed,
            }
            for c in got.candidates
        ]
        return rows, got.generation

    async def close(self) -> None:
        await self._link.close()


class TrainerJobs:
    """Training jobs (SubmitJob/GetJob) and the policies they register (GetPolicy)."""

    def __init__(self, settings: SocietySettings) -> None:
        self._link = _Link(settings, "trainer", trainer_grpc.TrainerServiceStub)

    @property
    def configured(self) -> bool:
        return self._link.configured

    async def submit(self, spec: jobs_pb2.TrainingJobSpec, *, dry_run: bool = False) -> trainer_pb.SubmitJobResponse:
        return await self._link.call("SubmitJob", trainer_pb.SubmitJobRequest(spec=spec, dry_run=dry_run))

    async def get_job(self, job_id: str) -> jobs_pb2.TrainingJob:
        return (await self._link.call("GetJob", trainer_pb.GetJobRequest(job_id=job_id))).job

    async def get_policy(self, policy_id: str) -> Any:
        return (await self._link.call("GetPolicy", trainer_pb.GetPolicyRequest(policy_id=policy_id))).policy

    async def close(self) -> None:
        await self._link.close()
