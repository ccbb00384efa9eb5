"""A lower bound for a Select hot path on grpcio's sync server (an experiment, not the service).

    taskset -c 1 python bench/select/proposed/minimal_sync_server.py PORT mini|echo [WORKERS]

``mini`` does the least a Flywheel Select must do: check a bearer token, Beta Thompson
sampling over 3 arms, a decision id, a response from cached Structs, a buffer append, a
Prometheus counter, and a flusher thread that builds and serializes one DecisionEvent per
decision every 20 ms (no PostgreSQL, no JetStream). ``echo`` returns one prebuilt response.
Drive both with the bench's request from core 0, framed once with the bench's own helpers:

    python -c "import sys; sys.path.insert(0, 'bench/select'); import run as R; \
        open('select.bin', 'wb').write(R.grpc_frame(R.select_request()))"

    taskset -c 0 h2load -t 1 -c 4 -m 16 -D 6 -d select.bin -H "content-type: application/grpc" \
        -H "te: trailers" -H "authorization: Bearer t" \
        http://127.0.0.1:PORT/flywheel.api.optimizer.v1.SelectionService/Select

Measured 2026-11-22 (two alternating runs each): echo ~4,990 Select/s at 200 us of server CPU
per call, mini ~4,230 Select/s at 237 us: 0.85x, with no I/O at all. See bench/select/README.md.
"""

import random
import secrets
import signal
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from prometheus_client import Counter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peers import PARAMS

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import events_pb2
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc

mode = sys.argv[2]
ARMS = list(PARAMS)
POST = {"fast": (21.0, 181.0), "balanced": (31.0, 171.0), "careful": (41.0, 161.0)}
PROB = {"fast": 0.05, "balanced": 0.25, "careful": 0.70}
CALLS = Counter("calls", "calls", ["method", "code"]).labels("Select", "OK")
buf = []
ECHO = sel_pb.SelectResponse(decision_id="0" * 32, arm_id="fast", params=PARAMS["fast"], probability=1 / 3)


def flusher():
    global buf
    while True:
        time.sleep(0.02)
        batch, buf = buf, []
        for did, arm, prob, user, ctx, _t in batch:
            events_pb2.DecisionEvent(
                meta=EventMeta(event_id=did, source="optimizer"),
                decision_id=did,
                endpoint="bench",
                arm_id=arm,
                params=PARAMS[arm],
                probability=prob,
                user_id=user,
                context=ctx,
            ).SerializeToString()


class S(sel_grpc.SelectionServiceServicer):
    def Select(self, request, context):
        if mode == "echo":
            return ECHO
        for k, v in context.invocation_metadata():
            if k == "authorization":
                if v != "Bearer t":
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
                break
        else:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")
        best, arm = -1.0, None
        for a in ARMS:
            al, be = POST[a]
            x = random.betavariate(al, be)
            if x > best:
                best, arm = x, a
        did = f"{int(time.time() * 1000):012x}{secrets.token_hex(10)}"
        buf.append((did, arm, PROB[arm], request.user_id, request.context, time.time()))
        CALLS.inc()
        return sel_pb.SelectResponse(decision_id=did, arm_id=arm, params=PARAMS[arm], probability=PROB[arm])


server = grpc.server(futures.ThreadPoolExecutor(max_workers=int(sys.argv[3]) if len(sys.argv) > 3 else 8))
sel_grpc.add_SelectionServiceServicer_to_server(S(), server)
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
server.start()
if mode != "echo":
    threading.Thread(target=flusher, daemon=True).start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
while not stop.wait(0.2):
    pass
