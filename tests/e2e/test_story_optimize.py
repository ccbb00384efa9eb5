"""Stage 1's honesty: a batch run that failed, or whose evaluations all failed, stops the story
with the run's own reason instead of handing empty configs to the next stage. (Stage 1 on real
servers is checked in test_story.py, on the undisturbed telling.)"""

from __future__ import annotations

import pytest

from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.stack.story.optimize import StageFailed, check_run


def test_a_failed_run_or_one_whose_evaluations_all_failed_stops_the_story() -> None:
    failed = runs_pb2.Run(run_id="run-x", state=runs_pb2.RUN_STATE_FAILED, error="48 of 48 evaluations failed")
    with pytest.raises(StageFailed, match="run-x ended RUN_STATE_FAILED: 48 of 48"):
        check_run(failed)
    all_failed = runs_pb2.Run(
        run_id="run-y",
        state=runs_pb2.RUN_STATE_SUCCEEDED,
        evaluations_done=4,
        evaluations_failed=4,
        top_errors=[runs_pb2.ErrorCount(message="connection refused", count=4)],
    )
    with pytest.raises(StageFailed, match=r"4 of 4 evaluations failed: connection refused \(x4\)"):
        check_run(all_failed)
    with pytest.raises(StageFailed, match="0 of 0"):
        check_run(runs_pb2.Run(run_id="run-z", state=runs_pb2.RUN_STATE_SUCCEEDED))
    check_run(runs_pb2.Run(run_id="ok", state=runs_pb2.RUN_STATE_SUCCEEDED, evaluations_done=4, evaluations_failed=3))
