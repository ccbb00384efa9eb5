"""lag.py with the product (the bench process) placed apart from the servers and replicas.

    python bench/service-regret/tried/product_placement.py nice 10 --replicas 1 --modes unpaced --repeats 2 --out X.json
    python bench/service-regret/tried/product_placement.py pin - --replicas 1 --modes unpaced --repeats 2 --out X.json

``nice N``: every thread of the product runs at nice N; the servers and optimizer replicas it
starts run at nice 0. ``pin``: the product runs on CPU 0 only, the servers and replicas on CPU 1
only. The rest of the arguments go to lag.py, whose stamp then names lag.py's own command line,
not this wrapper: the README names the wrapper beside each figure. Tried on 2026-12-08 to see
whether the product sharing the 2 cores with the service explains the one-replica unpaced lag;
neither helped (bench/service-regret/README.md, "Tried on 2026-12-08").
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent / "regret")]
import service  # noqa: E402


def place(product: bool, how: str, nice: int) -> None:
    """Every thread of this process as the product (``product``) or as the servers' parent."""
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            if how == "nice":
                os.setpriority(os.PRIO_PROCESS, tid, nice if product else 0)
            else:
                os.sched_setaffinity(tid, {0} if product else {1})
        except OSError:
            pass  # a thread that ended meanwhile


def main() -> None:
    how, value, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if how not in ("nice", "pin"):
        raise SystemExit("usage: product_placement.py nice N|pin - LAG_ARGS...")
    nice = int(value) if how == "nice" else 0
    start, scale = service.Stack.start, service.Stack.scale

    def placed(method):  # children inherit the placement of the thread that starts them
        def run(self, *args):
            place(False, how, nice)
            try:
                return method(self, *args)
            finally:
                place(True, how, nice)

        return run

    service.Stack.start, service.Stack.scale = placed(start), placed(scale)
    sys.argv = [str(HERE / "lag.py"), *rest]
    runpy.run_path(str(HERE / "lag.py"), run_name="__main__")


if __name__ == "__main__":
    main()
