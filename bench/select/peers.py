"""The peers of bench/select, each a gRPC server of flywheel.api.optimizer.v1.SelectionService
(the same generated request/response types as Flywheel's Select), one process per peer:

    python bench/select/peers.py --kind echo|mabwiser|convergence --flavour aio|sync --port N

- ``echo``: a bare grpcio server that returns one fixed, prebuilt SelectResponse (SelectBatch:
  as many copies as requested). The ceiling of a Python grpcio server on this core.
- ``mabwiser``: MABWiser's ThompsonSampling (Beta(1, 1) priors, binary rewards), fitted on
  2,000 logged decisions of three arms, then ``predict()`` once per Select.
- ``convergence``: The Convergence's runtime API (``configure_runtime`` + ``runtime_select``)
  with an in-memory ``RuntimeStorageProtocol`` implementation shaped like the one in the
  package's own quickstart example (0.1.8 ships none), seeded with three default arms and
  fed 2,000 ``runtime_update`` rewards before serving. Its API is async: on grpc.aio its
  coroutines are awaited in the handlers; on the sync server (``SyncConvergence``) they run to
  completion on one private event loop per process. ``CONVERGENCE_SERVER`` is the kind that
  served it fastest; bench/select/run.py runs it there (the headline row) and on the other kind
  (a second row).

Peers get every advantage that is theirs to take: the params Struct of each arm is built once
(Flywheel builds it per call), they log nothing (Flywheel buffers every decision and writes it
to PostgreSQL and JetStream), and no interceptor (Flywheel has one for auth, errors, metrics).
Each decision still gets an id, as the Select contract requires.

The server counts the calls it answered OK and prints ``{"ok": {...}}`` as one JSON line on
SIGTERM, so the bench can check that h2load's 2xx were gRPC successes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
import uuid
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

# The same three arms Flywheel's endpoint gets (bench/select/run.py creates it from these).
ARMS: dict[str, dict[str, Any]] = {
    "fast": {"model": "small-chat", "temperature": 0.2, "max_tokens": 512},
    "balanced": {"model": "medium-chat", "temperature": 0.5, "max_tokens": 1024},
    "careful": {"model": "large-chat", "temperature": 0.0, "max_tokens": 2048},
}
# True success rates used to make the fitting data (binary rewards).
RATES = {"fast": 0.10, "balanced": 0.15, "careful": 0.20}
FIT_ROWS = 2000
# The gRPC server kind The Convergence serves Select fastest on (``--flavour``), measured with
# both in --quick runs (bench/select/README.md); run.py's headline row uses it.
CONVERGENCE_SERVER = "sync"


def _struct(d: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(d)
    return s


PARAMS = {arm: _struct(p) for arm, p in ARMS.items()}


def fitting_data(seed: int = 7) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    arms = list(ARMS)
    decisions = [arms[i] for i in rng.integers(0, len(arms), FIT_ROWS)]
    rewards = [int(rng.random() < RATES[a]) for a in decisions]
    return decisions, rewards


class Echo:
    def __init__(self, busy_us: float = 0.0) -> None:
        self.response = sel_pb.SelectResponse(
            decision_id="0" * 32, arm_id="fast", params=PARAMS["fast"], probability=1 / 3
        )
        self._batches: dict[int, sel_pb.SelectBatchResponse] = {}
        self._busy_s = busy_us / 1e6

    def select(self, request: sel_pb.SelectRequest) -> sel_pb.SelectResponse:
        if self._busy_s:  # an experiment's stand-in for a handler's own Python (thread_cpu.py --busy-us)
            until = time.thread_time() + self._busy_s
            while time.thread_time() < until:
                pass
        return self.response

    def select_batch(self, request: sel_pb.SelectBatchRequest) -> sel_pb.SelectBatchResponse:
        n = len(request.requests)
        found = self._batches.get(n)
        if found is None:
            found = self._batches[n] = sel_pb.SelectBatchResponse(decisions=[self.response] * n)
        return found


class Mabwiser:
    def __init__(self, seed: int = 11) -> None:
        from mabwiser.mab import MAB, LearningPolicy

        self.mab = MAB(list(ARMS), LearningPolicy.ThompsonSampling(), seed=seed)
        decisions, rewards = fitting_data()
        self.mab.fit(decisions, rewards)

    def _response(self, arm: str) -> sel_pb.SelectResponse:
        # MABWiser does not expose the probability of the arm it sampled: 0 means unknown.
        return sel_pb.SelectResponse(decision_id=uuid.uuid4().hex, arm_id=arm, params=PARAMS[arm])

    def select(self, request: sel_pb.SelectRequest) -> sel_pb.SelectResponse:
        return self._response(self.mab.predict())

    def select_batch(self, request: sel_pb.SelectBatchRequest) -> sel_pb.SelectBatchResponse:
        n = len(request.requests)
        # One vectorised call: context-free policies predict one arm per row of "contexts".
        arms = self.mab.predict(np.zeros((n, 1))) if n > 1 else [self.mab.predict()]
        return sel_pb.SelectBatchResponse(decisions=[self._response(a) for a in arms])


class MemoryRuntimeStorage:
    """In-memory RuntimeStorageProtocol for The Convergence 0.1.8 (which ships none): the shape
    of the in-memory storage its quickstart example defines (arms and decisions in dicts)."""

    def __init__(self) -> None:
        self.arms: dict[str, list[dict[str, Any]]] = {}
        self.decisions: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _key(user_id: str, agent_type: str) -> str:
        return f"{user_id}:{agent_type}"

    async def get_arms(self, *, user_id: str, agent_type: str) -> list[Any]:
        return self.arms.get(self._key(user_id, agent_type), [])

    async def initialize_arms(self, *, user_id: str, agent_type: str, arms: list[dict[str, Any]]) -> None:
        key = self._key(user_id, agent_type)
        if key not in self.arms:
            self.arms[key] = [
                {
                    "arm_id": a["arm_id"],
                    "name": a.get("name"),
                    "params": a.get("params", {}),
                    "alpha": 1.0,
                    "beta": 1.0,
                    "total_pulls": 0,
                    "total_reward": 0.0,
                    "mean_estimate": None,
                    "metadata": {},
                }
                for a in arms
            ]

    async def create_decision(
        self,
        *,
        user_id: str,
        agent_type: str,
        arm_pulled: str,
        strategy_params: dict[str, Any],
        arms_snapshot: list[dict[str, Any]],
        metadata: dict[str, Any] | None = None,
    ) -> str:
        decision_id = uuid.uuid4().hex
        self.decisions[decision_id] = {
            "decision_id": decision_id,
            "user_id": user_id,
            "agent_type": agent_type,
            "arm_id": arm_pulled,
            "params": strategy_params,
            "arms_snapshot": arms_snapshot,
            "metadata": metadata or {},
        }
        return decision_id

    async def update_performance(
        self,
        *,
        user_id: str,
        agent_type: str,
        decision_id: str,
        reward: float,
        engagement: float | None = None,
        grading: float | None = None,
        metadata: dict[str, Any] | None = None,
        computed_update: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        arm_id = self.decisions.get(decision_id, {}).get("arm_id")
        for arm in self.arms.get(self._key(user_id, agent_type), []):
            if arm["arm_id"] == arm_id and computed_update:
                for field in ("alpha", "beta", "total_pulls", "total_reward", "mean_estimate", "avg_reward"):
                    if field in computed_update:
                        arm[field] = computed_update[field]
        return {"success": True}

    async def get_decision(self, *, user_id: str, decision_id: str) -> dict[str, Any]:
        return self.decisions.get(decision_id, {})


class Convergence:
    SYSTEM = "bench-select"

    def __init__(self) -> None:
        self.storage = MemoryRuntimeStorage()

    async def setup(self, user_id: str) -> None:
        from convergence import configure_runtime, runtime_select, runtime_update
        from convergence.types import RuntimeArmTemplate, RuntimeConfig

        self._select = runtime_select
        config = RuntimeConfig(
            system=self.SYSTEM,
            default_arms=[RuntimeArmTemplate(arm_id=a, name=a, params=p) for a, p in ARMS.items()],
        )
        await configure_runtime(self.SYSTEM, config=config, storage=self.storage)
        decisions, rewards = fitting_data()
        for arm, reward in zip(decisions, rewards, strict=True):
            # runtime_update needs a decision of that arm: record one as Select would.
            sel = await runtime_select(self.SYSTEM, user_id=user_id)
            self.storage.decisions[sel.decision_id]["arm_id"] = arm
            await runtime_update(self.SYSTEM, user_id=user_id, decision_id=sel.decision_id, reward=float(reward))
        self.storage.decisions.clear()

    async def select(self, request: sel_pb.SelectRequest) -> sel_pb.SelectResponse:
        context = json_format.MessageToDict(request.context) if request.HasField("context") else None
        sel = await self._select(self.SYSTEM, user_id=request.user_id, context=context)
        # Convergence's sampled_value is a Beta draw, not a selection probability: 0 means unknown.
        return sel_pb.SelectResponse(decision_id=sel.decision_id or "", arm_id=sel.arm_id, params=PARAMS[sel.arm_id])

    async def select_batch(self, request: sel_pb.SelectBatchRequest) -> sel_pb.SelectBatchResponse:
        return sel_pb.SelectBatchResponse(decisions=[await self.select(r) for r in request.requests])


class SyncConvergence:
    """The Convergence behind grpcio's thread-pool server: its coroutines run to completion on
    one private event loop, one call at a time (a threading lock). The in-memory storage never
    suspends, so a call is a few synchronous steps; serialising them also keeps the runtime's
    ``asyncio.Lock`` objects uncontended (they are not thread-safe) and costs nothing a GIL-bound
    handler would not pay anyway."""

    def __init__(self, user_id: str) -> None:
        self.impl = Convergence()
        self.loop = asyncio.new_event_loop()
        self.lock = threading.Lock()
        self.loop.run_until_complete(self.impl.setup(user_id))

    def select(self, request: sel_pb.SelectRequest) -> sel_pb.SelectResponse:
        with self.lock:
            return self.loop.run_until_complete(self.impl.select(request))

    def select_batch(self, request: sel_pb.SelectBatchRequest) -> sel_pb.SelectBatchResponse:
        with self.lock:
            return self.loop.run_until_complete(self.impl.select_batch(request))


# --- servers ---------------------------------------------------------------------------------


STATS_METHOD = "/bench.select.Stats/Counts"


class Counts:
    """Calls answered OK and calls that raised (answered with a non-OK status)."""

    def __init__(self) -> None:
        self.select = 0
        self.select_batch = 0
        self.decisions = 0
        self.errors = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "select": self.select,
            "select_batch": self.select_batch,
            "decisions": self.decisions,
            "errors": self.errors,
        }

    def stats_handler(self) -> grpc.GenericRpcHandler:
        """``/bench.select.Stats/Counts``: the counts as JSON bytes (raw, no protobuf)."""

        def counts(request: bytes, context: Any) -> bytes:
            return json.dumps(self.as_dict()).encode()

        return grpc.method_handlers_generic_handler(
            "bench.select.Stats", {"Counts": grpc.unary_unary_rpc_method_handler(counts)}
        )


def _aio_servicer(impl: Any, counts: Counts, is_async: bool) -> Any:
    async def call(fn: Any, request: Any) -> Any:
        try:
            return (await fn(request)) if is_async else fn(request)
        except Exception:
            counts.errors += 1
            raise

    class Servicer(sel_grpc.SelectionServiceServicer):
        async def Select(self, request, context):
            response = await call(impl.select, request)
            counts.select += 1
            counts.decisions += 1
            return response

        async def SelectBatch(self, request, context):
            response = await call(impl.select_batch, request)
            counts.select_batch += 1
            counts.decisions += len(response.decisions)
            return response

    return Servicer()


def _sync_servicer(impl: Any, counts: Counts) -> Any:
    lock = threading.Lock()

    def call(fn: Any, request: Any) -> Any:
        try:
            return fn(request)
        except Exception:
            with lock:
                counts.errors += 1
            raise

    class Servicer(sel_grpc.SelectionServiceServicer):
        def Select(self, request, context):
            response = call(impl.select, request)
            with lock:
                counts.select += 1
                counts.decisions += 1
            return response

        def SelectBatch(self, request, context):
            response = call(impl.select_batch, request)
            with lock:
                counts.select_batch += 1
                counts.decisions += len(response.decisions)
            return response

    return Servicer()


OPTIONS = [("grpc.max_receive_message_length", 32 * 1024 * 1024)]


async def serve_aio(impl: Any, port: int, user_id: str) -> Counts:
    counts = Counts()
    is_async = isinstance(impl, Convergence)
    if is_async:
        await impl.setup(user_id)
    server = grpc.aio.server(options=OPTIONS)
    sel_grpc.add_SelectionServiceServicer_to_server(_aio_servicer(impl, counts, is_async), server)
    server.add_generic_rpc_handlers((counts.stats_handler(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"serving": port}), flush=True)
    await stop.wait()
    await server.stop(0.5)
    return counts


def serve_sync(impl: Any, port: int, workers: int) -> Counts:
    counts = Counts()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=OPTIONS)
    sel_grpc.add_SelectionServiceServicer_to_server(_sync_servicer(impl, counts), server)
    server.add_generic_rpc_handlers((counts.stats_handler(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"serving": port}), flush=True)
    while not stop.wait(0.2):
        pass
    server.stop(0.5).wait()
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("echo", "mabwiser", "convergence"), required=True)
    parser.add_argument("--flavour", choices=("aio", "sync"), default="aio")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=8, help="thread pool of the sync server")
    parser.add_argument("--user-id", default="u-1", help="the user id the bench's requests carry")
    parser.add_argument("--busy-us", type=float, default=0.0, help="echo only: spin this many us of Python per Select")
    args = parser.parse_args(argv)
    impl: Any
    if args.kind == "convergence" and args.flavour == "sync":
        impl = SyncConvergence(args.user_id)
    else:
        impl = {"echo": lambda: Echo(args.busy_us), "mabwiser": Mabwiser, "convergence": Convergence}[args.kind]()
    if args.flavour == "sync":
        counts = serve_sync(impl, args.port, args.workers)
    else:
        counts = asyncio.run(serve_aio(impl, args.port, args.user_id))
    print(json.dumps({"ok": counts.as_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
