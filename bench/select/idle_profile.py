"""What an idle optimizer's event loop spends its CPU on: cProfile of the main thread.

    python bench/select/idle_profile.py [--seconds 20] [--top 25]

Starts NATS, PostgreSQL and S3, runs ``python -m cProfile -m flywheel.optimizer`` with no
endpoint and no load, stops it with SIGTERM after ``--seconds`` of SERVING, and prints the
Flywheel functions by cumulative time. cProfile sees only the main thread, which is the event
loop (posterior refresh, decision log, run driver, readiness); it slows Python down, so read
the figures as shares, not as absolute costs. Startup imports are in the profile too: look at
the background loops (``cache.py:refresh``, ``decisions.py:run``, ``driver.py:run``).
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from flywheel.stack.servers import free_port
from flywheel.stack.services import health_status, migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # bench/select/run.py: the scratch folder and stack helpers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work, servers = bench.new_work("flywheel-idle-profile-")
    profile = work / "optimizer.prof"
    try:
        servers.start()
        env = servers.env(namespace="bidle", schema="bench_idle", bucket_prefix="bidle")
        migrate("optimizer", env)
        port = free_port()
        env |= {
            "FLYWHEEL_OPTIMIZER_GRPC_HOST": "127.0.0.1",
            "FLYWHEEL_OPTIMIZER_GRPC_PORT": str(port),
            "FLYWHEEL_OPTIMIZER_METRICS_PORT": str(free_port()),
            "FLYWHEEL_OPTIMIZER_LOG_LEVEL": "WARNING",
        }
        cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "flywheel.optimizer"]
        proc = subprocess.Popen(cmd, env={**os.environ, **env})
        deadline = time.monotonic() + 120
        while health_status(f"127.0.0.1:{port}") != "SERVING":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the optimizer did not become SERVING")
            time.sleep(0.2)
        time.sleep(args.seconds)
        proc.send_signal(signal.SIGTERM)  # a clean exit writes the profile
        proc.wait(30)
        print(f"idle for {args.seconds:.0f} s after SERVING (startup imports included below)")
        pstats.Stats(str(profile)).sort_stats("cumtime").print_stats(r"flywheel/optimizer/|flywheel/core/", args.top)
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
