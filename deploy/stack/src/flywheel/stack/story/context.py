"""What every stage of the story gets: the running stack, the model server, the sizes, the
record it fills, where it reports progress, and the hooks a kill drill uses to disturb it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from flywheel.stack.servers import ModelServer
from flywheel.stack.stack import Stack
from flywheel.stack.story.record import StoryRecord

ENDPOINT = "support-assistant"  # the product's endpoint, its traces' agent, the policy's name

# Named points where a stage calls ``StoryHooks.reached`` while work is in flight (a batch run
# evaluating, an SAO round judging, traffic half served, a training job stepping, a canary
# being decided). The kill drill kills a service at one of them and restarts it.
POINTS = (
    "optimize.running",  # the batch run has evaluations in flight and the society is thinking
    "optimize.sao_running",  # the SAO round is generating / judging
    "traffic.halfway",  # half the product traffic served, feedback and traces in flight
    "training.running",  # the DPO job has been picked up by the trainer
    "canary.running",  # the canary arm is serving and being judged by feedback
)


@dataclass(frozen=True)
class StorySizes:
    """How big each stage is: ``demo()`` for ``./dev demo`` (under 10 minutes on 2 cores),
    ``e2e()`` for the end-to-end test and the kill drill (a tiny model, a few steps)."""

    base_model: str = "auto"  # the model server's and the trainer's base: auto, smollm2 or tiny
    test_cases: int = 4
    population: int = 4
    generations: int = 3
    sao_personas: int = 4
    arms: int = 3
    traffic_decisions: int = 300
    traffic_questions: int = 16  # of the 16 shipped; each new (question, arm) answer is generated once
    answer_variants: int = 2  # answers an arm gives one question in stage 2 (users asking again)
    canary_max_decisions: int = 800
    dpo_steps: int = 4
    seed: int = 7

    @classmethod
    def demo(cls) -> StorySizes:
        return cls()

    @classmethod
    def e2e(cls) -> StorySizes:
        return cls(
            base_model="tiny",
            test_cases=4,
            population=3,
            generations=2,
            sao_personas=3,
            arms=3,
            traffic_decisions=150,  # 16 questions x 3 arms x 3 answers: enough pairs for 10 rows
            answer_variants=3,
            traffic_questions=16,
            canary_max_decisions=200,
            dpo_steps=2,
        )


class StoryHooks(Protocol):
    async def reached(self, point: str, ctx: StoryContext) -> None:
        """Called once at each of ``POINTS`` the story passes; may kill and restart services."""


class NoHooks:
    async def reached(self, point: str, ctx: StoryContext) -> None:
        return None


class Bar(Protocol):
    def update(self, *, completed: float | None = None, total: float | None = None, note: str = "") -> None: ...


class StoryProgress(Protocol):
    """Where stages report progress: rich bars in the demo, nothing in tests."""

    def bar(self, description: str, total: float | None) -> AbstractContextManager[Bar]: ...

    def say(self, text: str) -> None: ...


class _NoBar:
    def update(self, *, completed: float | None = None, total: float | None = None, note: str = "") -> None:
        return None


class QuietProgress:
    """Progress for tests: ``say`` lines are kept (a failing test prints them), each after the
    seconds since this progress was made (where a slow story spends its time), bars do nothing."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._t0 = time.monotonic()

    @contextmanager
    def bar(self, description: str, total: float | None) -> Iterator[Bar]:
        self.say(description)
        yield _NoBar()

    def say(self, text: str) -> None:
        self.lines.append(f"{time.monotonic() - self._t0:7.1f}s {text}")


@dataclass
class StoryContext:
    stack: Stack
    model: ModelServer
    sizes: StorySizes
    served_model: str  # the model server's base model name (what /v1/models lists first)
    record: StoryRecord = field(default_factory=StoryRecord)
    progress: StoryProgress = field(default_factory=QuietProgress)
    hooks: StoryHooks = field(default_factory=NoHooks)
    endpoint: str = ENDPOINT
    # Handed from stage to stage (beside what the record keeps for people).
    top_configs: list[dict] = field(default_factory=list)  # stage 1 -> 2: [{"params", "score"}]
    answers: dict[tuple[str, str], str] = field(default_factory=dict)  # (case id, arm id) -> answer

    def address(self, service: str) -> str:
        return self.stack.services[service].address
