"""Fakes and fixtures for the RLP service tests: a scripted reasoning model, the optimizer's
run config and candidates, a publisher that records, a trainer; the society's tables in a
fresh schema of the session's real PostgreSQL (``servers``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.optimizer.v1.events_pb2 import RunProgressEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.core.bus.consumer import Delivery
from flywheel.society.rlp.service import RlpService
from flywheel.society.settings import SocietySettings

SPACE = {"parameters": {"t": {"type": "float", "min": 0.0, "max": 1.0, "step": 0.1}, "n": [128, 256, 512]}}


def run_config(num_thoughts: int = 2, **society: Any) -> dict[str, Any]:
    block = {"enabled": True, "learning": {"rlp_enabled": True, "rlp": {"num_thoughts": num_thoughts}}, **society}
    return {"search_space": SPACE, "society": block}


def answer(*thoughts: tuple[str, list[tuple[float, int, float]]]) -> str:
    """A reasoning model's JSON answer: thoughts with (t, n, predicted score) proposals."""
    return json.dumps(
        {
            "thoughts": [
                {
                    "thought": text,
                    "proposals": [
                        {"params": {"t": t, "n": n}, "predicted_score": p, "sigma": 0.1} for t, n, p in props
                    ],
                }
                for text, props in thoughts
            ]
        }
    )


GOOD = answer(
    ("warmer sampling finds better answers", [(0.9, 512, 0.8)]),
    ("colder sampling is more precise", [(0.1, 256, 0.6)]),
)


class FakeThinker:
    """Answers from a script: a text, an exception to raise, or "sleep" (outlasts the timeout)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, messages, *, model, temperature, max_tokens, response_format=None):
        self.calls.append(
            {
                "messages": messages,
                "model": model,
                "temperature": temperature,
                "max": max_tokens,
                "response_format": response_format,
            }
        )
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, BaseException):
            raise item
        if item == "sleep":
            await asyncio.sleep(30)
        return item


class FakeRuns:
    configured = True

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.rows: list[dict[str, Any]] = []
        self.generation = 0
        self.config_calls = 0

    async def run_config(self, run_id: str) -> dict[str, Any]:
        self.config_calls += 1
        return self.config

    async def candidates(self, run_id: str, *, min_generation: int = 0) -> tuple[list[dict[str, Any]], int]:
        return [r for r in self.rows if r["generation"] >= min_generation], self.generation

    def add(self, gen: int, params: dict[str, Any], score: float, *, cases: int = 3, origin: str = "offspring") -> None:
        # As the optimizer gives them back: numbers are Struct doubles.
        params = {
            k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in params.items()
        }
        self.rows.append(
            {
                "candidate_id": f"c{len(self.rows):05d}",
                "generation": gen,
                "params": params,
                "origin": origin,
                "score": score,
                "cases": cases,
                "failed": 0,
            }
        )


def _double(v: Any) -> Any:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, str]] = []

    async def publish(self, subject: str, message: Any, *, msg_id: str | None = None, as_json: bool = False) -> None:
        self.sent.append((subject, message, msg_id or ""))


class FakeTrainer:
    configured = True

    def __init__(self) -> None:
        self.specs: list[jobs_pb2.TrainingJobSpec] = []
        self.state = jobs_pb2.JOB_STATE_QUEUED

    async def submit(self, spec: jobs_pb2.TrainingJobSpec, *, dry_run: bool = False) -> Any:
        self.specs.append(spec)
        return type("R", (), {"job": jobs_pb2.TrainingJob(job_id=f"job-{len(self.specs)}", spec=spec)})()

    async def get_job(self, job_id: str) -> jobs_pb2.TrainingJob:
        pid = "pol-1" if self.state == jobs_pb2.JOB_STATE_SUCCEEDED else ""
        return jobs_pb2.TrainingJob(job_id=job_id, state=self.state, policy_id=pid)

    async def get_policy(self, policy_id: str) -> jobs_pb2.Policy:
        name = self.specs[-1].policy_name
        return jobs_pb2.Policy(policy_id=policy_id, name=name, version=1, checkpoint_uri="s3://ckpt/jobs/job-1/adapter")


def progress(run_id: str, generation: int, state: int = runs_pb2.RUN_STATE_RUNNING) -> RunProgressEvent:
    return RunProgressEvent(
        meta=EventMeta(event_id=f"{run_id}.{generation}.{state}"),
        progress=runs_pb2.RunProgress(run_id=run_id, state=state, generation=generation),
    )


def delivery(n: int = 1) -> Delivery:
    return Delivery(subject="x", headers={}, stream_sequence=1, num_delivered=n)


def make_service(sessions, runs, think, *, publisher=None, trainer=None, objects=None, scorer=None, **settings):
    load_adapter = settings.pop("load_adapter", None)
    s = SocietySettings(step_timeout_s=settings.pop("step_timeout_s", 2.0), **settings)
    return RlpService(
        settings=s,
        sessions=sessions,
        publisher=publisher or FakePublisher(),
        catalogue=Catalogue("tns"),
        runs=runs,
        trainer=trainer,
        objects=objects,
        start_sao=None,
        think=think,
        scorer=scorer,
        load_adapter=load_adapter,
    )
