"""Where the optimizer's CPU goes under Select load: CPU per thread, per decision.

    python bench/select/thread_cpu.py [--load select|batch|idle] [--seconds 8] [--target flywheel|echo|mabwiser]

Starts NATS, PostgreSQL and S3 on core 0 and the optimizer on core 1, exactly as run.py does,
puts h2load's saturated Select (or SelectBatch of 100) load on it, and reads every thread's
CPU time from /proc/<pid>/task/*/stat before and after. The event loop is the main thread;
grpcio's worker and polling threads are the other Python threads; "event_engine" is grpc's
C core. ``idle`` measures the background work with no load at all (CPU per second).
``--target echo`` (or ``mabwiser``) measures that peer of run.py on its sync server instead,
so Flywheel's extra cost per thread kind can be read side by side. ``--busy-us N`` makes the
echo spin N us of Python per Select: how much CPU a handler's own work really costs on this
server.

Per-thread accounting is the ground truth that sampling profilers only estimate: py-spy's
GIL-holder mode credited the event loop with time it never used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402  (bench/select/run.py: the stack, targets and h2load driver)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far by thread kind: the event loop (main thread) or the thread's name."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except FileNotFoundError:  # the thread ended between listdir and read
            continue
        fields = stat.rsplit(")", 1)[1].split()
        kind = "event loop (main thread)" if tid == str(pid) else f"{name} threads"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=["select", "batch", "idle"], default="select")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--target", choices=["flywheel", "echo", "mabwiser"], default="flywheel")
    parser.add_argument(
        "--busy-us", type=float, default=0.0, help="with --target echo: spin this many us of Python per Select"
    )
    args = parser.parse_args()
    work, servers = bench.new_work("flywheel-thread-cpu-")
    target = None
    try:
        env = bench.start_stack(servers, "bcpu", "bench_cpu")
        h2 = bench.H2load(bench.ensure_h2load(), work)
        if args.target == "flywheel":
            target = bench.FlywheelTarget(work, env)
        else:
            extra = ("--busy-us", str(args.busy_us)) if args.busy_us else ()
            target = bench.PeerTarget(work, f"{args.target}_sync", args.target, "sync", extra)
        target.start()
        bench.pin_tree(target.pid, {bench.SERVER_CPU})
        method = "SelectBatch" if args.load == "batch" else "Select"
        shape = {"clients": 2, "streams": 4} if args.load == "batch" else {"clients": 4, "streams": 16}
        h2.run(target.port, method="Select", seconds=1, headers=dict(target.headers), clients=4, streams=16)
        before, started = thread_cpu(target.pid), time.monotonic()
        if args.load == "idle":
            time.sleep(args.seconds)
            decisions_per_s = 0.0
        else:
            got = h2.run(target.port, method=method, seconds=args.seconds, headers=dict(target.headers), **shape)
            decisions_per_s = got.rps * (bench.BATCH if args.load == "batch" else 1)
        after, elapsed = thread_cpu(target.pid), time.monotonic() - started
        print(f"target: {args.target}, load: {args.load}, {decisions_per_s:,.0f} decisions/s over {elapsed:.1f} s")
        used = {k: (after[k] - before.get(k, 0.0)) / elapsed for k in after}
        for kind, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
            per = f"{1e6 * cpu / decisions_per_s:8.1f} us/decision" if decisions_per_s else ""
            print(f"  {kind:28s} {1000 * cpu:7.1f} ms CPU/s {per}")
        total = sum(used.values())
        per = f"{1e6 * total / decisions_per_s:8.1f} us/decision" if decisions_per_s else ""
        print(f"  {'total':28s} {1000 * total:7.1f} ms CPU/s {per}")
    finally:
        if target is not None:
            target.stop()
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
