"""lag.py with a serving replica whose feedback a second optimizer process applies.

    python bench/service-regret/tried/feedback_worker.py --replicas 2 --modes unpaced --repeats 2 --out X.json

An experiment (needs ``tried/feedback-worker.patch``): with ``--replicas 2``, replica 0 runs
without the durable feedback consumer (``FLYWHEEL_OPTIMIZER_EXP_NO_FEEDBACK_CONSUMER=true``) and
takes every Select; replica 1 takes none and applies all the feedback, its NOTIFY settling
replica 0's provisional folds as a peer's does. So replica 0's event loop keeps the provisional
folds, rebuilds and decision log, and gives the transactions to another process (another GIL).
The rest of the arguments go to lag.py, whose stamp names lag.py's own command line.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent / "regret")]
import service  # noqa: E402

NO_CONSUMER = {"FLYWHEEL_OPTIMIZER_EXP_NO_FEEDBACK_CONSUMER": "true"}


def main() -> None:
    scale, clients = service.Stack.scale, service.Stack.clients

    def scale_apart(self, n):  # replica 0 serves, the next ones apply the feedback
        while len(self.replicas) < n:
            base = self.env
            self.env = {**base, **NO_CONSUMER} if not self.replicas else base
            try:
                scale(self, len(self.replicas) + 1)
            finally:
                self.env = base
        scale(self, n)

    def serving_only(self):
        return clients(self)[:1]

    service.Stack.scale, service.Stack.clients = scale_apart, serving_only
    sys.argv = [str(HERE / "lag.py"), *sys.argv[1:]]
    runpy.run_path(str(HERE / "lag.py"), run_name="__main__")


if __name__ == "__main__":
    main()
