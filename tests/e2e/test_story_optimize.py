"""Stage 1 of the story on a real stack: the support assistant's batch run with the society on
(RLP before each generation, one SAO round beside it) against the tiny model server, with the
end-to-end sizes. What the record says is checked against itself: evaluations counted once
along the curve, the best-so-far never falling, the SAO round's counts adding up, the top
configs distinct and their replayable answers theirs.

The tiny random model writes gibberish: RLP steps are recorded but fail (``no_prediction``),
and the SAO round keeps no pair (no parseable ranking), so it fails saying so and registers no
dataset; with SmolLM2 (the demo) both can succeed. Both outcomes are asserted exactly."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.stack.story.context import StoryContext, StorySizes
from flywheel.stack.story.optimize import StageFailed, check_run, optimize
from flywheel.stack.story.run import run_stages, start_story_stack, stop_story_stack, story_context
from flywheel.stack.story.world import load_cases

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


class Hooks:
    def __init__(self) -> None:
        self.points: list[str] = []

    async def reached(self, point: str, ctx: StoryContext) -> None:
        self.points.append(point)


async def test_stage_one_runs_the_search_with_rlp_and_an_sao_round() -> None:
    sizes = StorySizes.e2e()
    root = Path(tempfile.mkdtemp(prefix="flywheel-story1-"))  # outside pytest's tmp (PostgreSQL's user)
    stack, model = start_story_stack(root, sizes)
    try:
        hooks = Hooks()
        ctx = story_context(stack, model, sizes, hooks=hooks)
        started = time.monotonic()
        await run_stages(ctx, [("optimize", optimize)])
        seconds = time.monotonic() - started
        rec = ctx.record.optimize
        assert rec is not None
        print(f"\nstage 1: {seconds:.1f} s; {json.dumps({k: rec[k] for k in ('rlp', 'sao')}, default=str)}")
        json.dumps(rec)  # plain JSON, as the record promises

        # The run: succeeded, every evaluation counted once along the curve, none failed.
        assert rec["state"] == "succeeded" and rec["run_id"].startswith("run-")
        assert rec["evaluations"] > 0 and rec["evaluations_failed"] == 0, rec
        curve = rec["curve"]
        assert curve and curve[-1]["evaluation"] == rec["evaluations"]
        assert [p["evaluation"] for p in curve] == sorted({p["evaluation"] for p in curve})
        bests = [p["best"] for p in curve if p["best"] is not None]
        assert bests and bests == sorted(bests)

        # The best distinct configs for stage 2, with the answers their evaluations got.
        tops = ctx.top_configs
        assert len(tops) == sizes.arms and rec["top_configs"] == tops
        assert len({json.dumps(t["params"], sort_keys=True) for t in tops}) == sizes.arms
        assert {"system_prompt", "temperature", "max_tokens"} == set(tops[0]["params"])
        case_ids = {c["id"] for c in load_cases(sizes.test_cases)}
        for top, out in zip(tops, rec["outputs"], strict=True):
            assert out["params"] == top["params"] and top["candidate_id"] in out["candidate_ids"]
            assert out["answers"] and set(out["answers"]) <= case_ids and set(out["scores"]) == set(out["answers"])

        # RLP: the society thought before the second generation (the tiny model's thoughts
        # do not parse: failed steps are recorded as such, never counted as proposals).
        rlp = rec["rlp"]
        assert rlp["steps"] >= 1 and 0 <= rlp["steps_failed"] <= rlp["steps"]
        assert rlp["proposals_resolved"] <= rlp["proposals"]
        if rlp["steps_failed"]:
            assert sum(rlp["failures"].values()) == rlp["steps_failed"]

        # SAO: the counts add up; a dataset exactly when pairs were kept.
        sao = rec["sao"]
        assert sao["round_id"] and sao["attempted"] == sizes.sao_personas
        assert sao["attempted"] == sao["kept"] + sum(sao["dropped"].values())
        if sao["state"] == "succeeded":
            assert sao["pairs"] == sao["kept"] > 0 and sao["manifest_uri"].endswith("/manifest.json")
        else:
            assert sao["state"] == "failed" and "no pair was kept" in sao["error"], sao
            assert sao["pairs"] == 0 and sao["dataset_id"] is None

        assert sorted(hooks.points) == ["optimize.running", "optimize.sao_running"]  # each once
        assert ctx.record.meta["stage_seconds"]["optimize"] > 0
    finally:
        stop_story_stack(stack, model)
        shutil.rmtree(root, ignore_errors=True)


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
