"""Update over gRPC: feedback applied per second on the thread-pool server against grpc.aio.

    python bench/select/update_rate.py [--rounds 2] [--seconds 6]

Products without NATS send feedback with `SelectionService.Update`. On the optimizer's default
sync server that method is bridged: a worker thread waits while the event loop applies it (one
PostgreSQL transaction, then a fresh snapshot for the response's statistics), so at most
``GRPC_WORKERS`` Updates are in flight. This measures what that costs against the ``aio``
server, where every call is a coroutine.

The stack and pinning are run.py's (the optimizer alone on core 1; h2load, NATS, PostgreSQL and
S3 on core 0). h2load posts one UpdateRequest for one logged decision with no feedback id, so
every call is a new feedback event applied to the same arm: the hottest row an endpoint has.
The server's own count of Update calls answered OK gives the rate. The arm's pulls grow by
that count plus the calls still in flight when h2load stopped: their callers left, and their
feedback was applied all the same. Flavours alternate for ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402  (bench/select/run.py: the stack, targets and h2load driver)

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb  # noqa: E402
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc  # noqa: E402
from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb  # noqa: E402
from flywheel.api.optimizer.v1 import selection_service_pb2_grpc as sel_grpc  # noqa: E402


def pulls(target: bench.FlywheelTarget, arm_id: str) -> float:
    with grpc.insecure_channel(target.address) as channel:
        got = admin_grpc.EndpointAdminServiceStub(channel).GetEndpoint(
            admin_pb.GetEndpointRequest(name=bench.ENDPOINT), metadata=target.metadata(), timeout=10
        )
    return next(s.pulls for s in got.endpoint.stats if s.arm_id == arm_id)


def one_round(work: Path, target: bench.FlywheelTarget, h2: bench.H2load, flavour: str, seconds: float) -> dict:
    target.start()
    try:
        bench.pin_tree(target.pid, {bench.SERVER_CPU})
        with grpc.insecure_channel(target.address) as channel:
            decision = sel_grpc.SelectionServiceStub(channel).Select(
                bench.select_request(), metadata=target.metadata(), timeout=10
            )
        time.sleep(0.5)  # the decision log's flush: Update finds the decision in PostgreSQL
        body = work / f"update-{flavour}.bin"
        body.write_bytes(bench.grpc_frame(sel_pb.UpdateRequest(decision_id=decision.decision_id, reward=1.0)))
        shape = {"clients": 4, "streams": 16, "headers": dict(target.headers), "body": body, "method": "Update"}
        h2.run(target.port, seconds=1, **shape)  # warm-up
        time.sleep(1.0)
        before_pulls, before = pulls(target, decision.arm_id), bench.settled_counts(target)
        got = h2.run(target.port, seconds=seconds, **shape)
        after = bench.settled_counts(target)
        time.sleep(1.0)  # a posterior refresh, so GetEndpoint's pulls include the last Updates
        after_pulls = pulls(target, decision.arm_id)
        ok = after.get("update", 0) - before.get("update", 0)
        return {
            "flavour": flavour,
            "updates_per_s": ok / got.seconds,
            "h2load_2xx": got.status_2xx,
            "server_ok": ok,
            "errors": after["errors"] - before["errors"],
            "pulls_added": after_pulls - before_pulls,
            "mean_ms": got.mean_ms,
        }
    finally:
        target.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    work, servers = bench.new_work("flywheel-update-rate-")
    results = []
    try:
        env = bench.start_stack(servers, "bupd", "bench_update")
        h2 = bench.H2load(bench.ensure_h2load(), work)
        targets = {f: bench.FlywheelTarget(work, {**env, "FLYWHEEL_OPTIMIZER_GRPC_SERVER": f}) for f in ("sync", "aio")}
        targets["aio"].fitted = True  # one endpoint in one database: the first start creates and fits it
        for i in range(args.rounds):
            for flavour in ("sync", "aio") if i % 2 == 0 else ("aio", "sync"):
                r = one_round(work, targets[flavour], h2, flavour, args.seconds)
                results.append(r)
                print(
                    f"{flavour:5s} {r['updates_per_s']:8,.0f} Update/s  mean {r['mean_ms']:6.1f} ms  "
                    f"server OK {r['server_ok']}  h2load 2xx {r['h2load_2xx']}  errors {r['errors']}  "
                    f"pulls added {r['pulls_added']:.0f}",
                    flush=True,
                )
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    best = {f: max(r["updates_per_s"] for r in results if r["flavour"] == f) for f in ("sync", "aio")}
    ratio = best["sync"] / best["aio"]
    print(f"best of rounds: sync {best['sync']:,.0f}/s, aio {best['aio']:,.0f}/s, sync/aio {ratio:.2f}")
    print(json.dumps({"name": "update_rate", "rounds": results, "best": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
