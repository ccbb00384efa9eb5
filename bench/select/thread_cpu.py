"""Where the optimizer's CPU goes under Select load: CPU per thread, per decision.

    python bench/select/thread_cpu.py [--load select|batch|idle] [--seconds 8] [--target flywheel|echo|mabwiser]
    python bench/select/thread_cpu.py --diffs change.diff [--rounds 5] [--rate 1500]
    python bench/select/thread_cpu.py --variant f40:DECISION_FLUSH_INTERVAL_S=0.04 --rate 2000 --rounds 5

Starts NATS, PostgreSQL and S3 on core 0 and the optimizer on core 1, exactly as run.py does,
puts h2load's saturated Select (or SelectBatch of 100) load on it, and reads every thread's
CPU time from /proc/<pid>/task/*/stat before and after. The event loop is the main thread;
grpcio's worker and polling threads are the other Python threads; "event_engine" is grpc's
C core. ``idle`` measures the background work with no load at all (CPU per second).
``--target echo`` (or ``mabwiser``) measures that peer of run.py on its sync server instead,
so Flywheel's extra cost per thread kind can be read side by side. ``--busy-us N`` makes the
echo spin N us of Python per Select: how much CPU a handler's own work really costs on this
server. ``--diffs`` also runs the optimizer with each diff applied (the stages of variants.py:
a copy of the sources, patched, first on its PYTHONPATH), alternating with it as is for
``--rounds`` rounds on the same stack, and prints the medians per thread kind: a paired A/B
of a change's cost in each thread; ``--variant NAME:KEY=VALUE`` does the same for settings.
``--rate N`` holds the load at N Select/s instead of saturating the server, so every target
makes the same decisions per second.

Per-thread accounting is the ground truth that sampling profilers only estimate: py-spy's
GIL-holder mode credited the event loop with time it never used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
    parser.add_argument(
        "--diffs", nargs="*", type=Path, default=[], help="also the optimizer with each diff applied, alternating"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every target, alternating")
    parser.add_argument(
        "--variant",
        dest="variants",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="also the optimizer as is with these FLYWHEEL_OPTIMIZER_* settings (as variants.py --variant)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Select/s in all (h2load --rps over its 4 clients) instead of saturating: every target then makes "
        "the same decisions per second, so the CPU of per-flush and periodic work compares too",
    )
    args = parser.parse_args()
    work, servers = bench.new_work("flywheel-thread-cpu-")
    target = None
    per_target: dict[str, list[dict[str, float]]] = {}
    try:
        env = bench.start_stack(servers, "bcpu", "bench_cpu")
        h2 = bench.H2load(bench.ensure_h2load(), work)
        if args.target == "flywheel":
            import variants  # bench/select/variants.py: the patched copies of the sources

            makers = [("as is", lambda: variants.Variant(work, env, "as is", None))]
            for text in args.variants:
                name, settings = variants.setting_variant(text)
                makers.append((name, lambda n=name, x=settings: variants.Variant(work, env, n, None, x)))
            for name, overlay, extra in variants.build_stages(work, args.diffs):
                makers.append((f"+ {name}", lambda n=name, o=overlay, x=extra: variants.Variant(work, env, n, o, x)))
        else:
            extra = ("--busy-us", str(args.busy_us)) if args.busy_us else ()
            makers = [(args.target, lambda: bench.PeerTarget(work, f"{args.target}_sync", args.target, "sync", extra))]
        for _ in range(args.rounds):
            for label, make in makers:
                target = make()
                target.start()
                try:
                    per_target.setdefault(label, []).append(measure(h2, target, args, label))
                finally:
                    target.stop()
                    target = None
    finally:
        if target is not None:
            target.stop()
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.rounds > 1 or len(per_target) > 1:
        unit = "us/decision" if args.load != "idle" else "ms CPU/s"
        print(f"medians over {args.rounds} rounds, {unit} (min-max):")
        for label, runs in per_target.items():
            print(f"  {label}")
            for kind in sorted(
                {k for r in runs for k in r}, key=lambda k: -statistics.median(r.get(k, 0) for r in runs)
            ):
                values = [r.get(kind, 0.0) for r in runs]
                print(f"    {kind:28s} {statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})")
    return 0


def measure(h2, target, args: argparse.Namespace, label: str) -> dict[str, float]:
    """One run: per thread kind, CPU per decision in us (ms of CPU per second under ``idle``)."""
    bench.pin_tree(target.pid, {bench.SERVER_CPU})
    method = "SelectBatch" if args.load == "batch" else "Select"
    shape = {"clients": 2, "streams": 4} if args.load == "batch" else {"clients": 4, "streams": 16}
    h2.run(target.port, method="Select", seconds=1, headers=dict(target.headers), clients=4, streams=16)
    before, started = thread_cpu(target.pid), time.monotonic()
    if args.load == "idle":
        time.sleep(args.seconds)
        decisions_per_s = 0.0
    else:
        rps = args.rate / shape["clients"] if args.rate else None
        got = h2.run(
            target.port,
            method=method,
            seconds=args.seconds,
            headers=dict(target.headers),
            rps_per_client=rps,
            **shape,
        )
        decisions_per_s = got.rps * (bench.BATCH if args.load == "batch" else 1)
    after, elapsed = thread_cpu(target.pid), time.monotonic() - started
    print(
        f"{label}: load {args.load}, {decisions_per_s:,.0f} decisions/s over {elapsed:.1f} s, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    used = {k: (after[k] - before.get(k, 0.0)) / elapsed for k in after}
    used["total"] = sum(used.values())
    out = {}
    for kind, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        per = f"{1e6 * cpu / decisions_per_s:8.1f} us/decision" if decisions_per_s else ""
        print(f"  {kind:28s} {1000 * cpu:7.1f} ms CPU/s {per}", flush=True)
        out[kind] = 1e6 * cpu / decisions_per_s if decisions_per_s else 1000 * cpu
    return out


if __name__ == "__main__":
    sys.exit(main())
