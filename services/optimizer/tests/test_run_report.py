"""A run's result files: the best config, the details, and readable reports with plots."""

from __future__ import annotations

import json
import re

from flywheel.optimizer.runs.report import Candidate, Evaluation, RunResults, outcome, render, summarize


def results() -> RunResults:
    configs = {
        "c1": {"model": "small", "temperature": 0.2},
        "c2": {"model": "large", "temperature": 0.7},
        "c3": {"model": "small", "temperature": 0.9},
    }
    scores = {"c1": [0.6, 0.8], "c2": [0.9, 0.9], "c3": [0.2, 0.4]}
    cost = {"c1": 0.001, "c2": 0.01, "c3": 0.002}
    return RunResults(
        run_id="run-1",
        name="support",
        config={"search_space": {}},
        candidates=[Candidate(cid, 0 if cid != "c3" else 1, cfg) for cid, cfg in configs.items()],
        evaluations=[
            Evaluation(cid, 0 if cid != "c3" else 1, f"case-{i}", s, latency_ms=100 * (i + 1), cost_usd=cost[cid])
            for cid, ss in scores.items()
            for i, s in enumerate(ss)
        ],
    )


def test_summary_ranks_by_mean_and_marks_the_pareto_front():
    s = summarize(results())
    assert [x.candidate_id for x in s] == ["c2", "c1", "c3"]
    assert s[0].mean_score == 0.9 and s[1].mean_score == 0.7
    # c3 costs more than c1 and scores less at the same latency: dominated.
    assert {x.candidate_id: x.pareto for x in s} == {"c2": True, "c1": True, "c3": False}


def test_render_writes_four_files_with_the_best_config_and_plots():
    files = render(results())
    assert set(files) == {"best_config.json", "detailed_results.json", "report.md", "report.html"}
    best = json.loads(files["best_config.json"])
    assert best["config"] == {"model": "large", "temperature": 0.7} and best["mean_score"] == 0.9
    detailed = json.loads(files["detailed_results.json"])
    assert len(detailed["evaluations"]) == 6 and detailed["best_so_far"] == [[0, 0.9], [1, 0.9]]
    md = files["report.md"].decode()
    assert "**0.9000**" in md and "| 1 | `c2` |" in md
    page = files["report.html"].decode()
    # best so far, distribution, one panel per parameter (2), the Pareto front
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"', page)) == 5
    assert "Effect of model" in page and "Effect of temperature" in page
    assert "Racing: each candidate is scored on a few test cases first" in page


def test_render_of_a_run_with_no_evaluations_still_writes_every_file():
    empty = RunResults(run_id="run-2", name="", config={}, candidates=[], evaluations=[], state="failed")
    files = render(empty)
    assert json.loads(files["best_config.json"])["config"] == {}
    assert "No candidate was evaluated." in files["report.html"].decode()


def test_a_candidate_raced_out_early_does_not_outrank_a_fully_scored_one():
    base = results()
    # c4 was scored on one case only (racing dropped it), with a lucky 1.0.
    raced = RunResults(
        run_id=base.run_id,
        name=base.name,
        config=base.config,
        candidates=[*base.candidates, Candidate("c4", 1, {"model": "tiny", "temperature": 1.0})],
        evaluations=[*base.evaluations, Evaluation("c4", 1, "case-0", 1.0)],
    )
    assert [s.candidate_id for s in summarize(raced)][:2] == ["c2", "c1"]
    # The run's own pick (the search's posterior) is what best_config.json reports.
    picked = RunResults(**{**raced.__dict__, "best_candidate_id": "c1"})
    assert json.loads(render(picked)["best_config.json"])["candidate_id"] == "c1"


def failing_results() -> RunResults:
    """Two candidates; c2 timed out on one case and got a 401 on the other."""
    evals = [
        Evaluation("c1", 0, "a", 0.8, latency_ms=120),
        Evaluation("c1", 0, "b", 0.6, latency_ms=140),
        Evaluation("c2", 0, "a", 0.0, error="timed out after 5s (attempt 3 of 3)"),
        Evaluation("c2", 0, "b", 0.0, error="POST http://x/v1 -> 401: missing key (attempt 1 of 3)"),
    ]
    return RunResults(
        run_id="run-f",
        name="failing",
        config={"evaluation": {"metrics": {"accuracy": {"weight": 1, "description": "Tool usage correctness"}}}},
        candidates=[Candidate("c1", 0, {"model": "a"}), Candidate("c2", 0, {"model": "b"})],
        evaluations=evals,
        warnings=("api.mock_mode: not supported; the target is called for real",),
    )


def test_failures_and_timeouts_are_counted_per_run_and_per_candidate():
    r = failing_results()
    o = outcome(r)
    assert (o.total, o.failed, o.timed_out) == (4, 2, 1)
    assert o.line() == "2 of 4 evaluations failed (1 timed out)"
    by_id = {s.candidate_id: s for s in summarize(r)}
    assert (by_id["c2"].errors, by_id["c2"].timeouts) == (2, 1)
    files = render(r)
    md, page = files["report.md"].decode(), files["report.html"].decode()
    for text in (md, page):
        assert "2 of 4 evaluations failed (1 timed out)" in text
        assert "POST http://x/v1 -&gt;" in text or "POST http://x/v1 ->" in text
        assert "api.mock_mode: not supported; the target is called for real" in text
        assert "accuracy" in text and "Tool usage correctness" in text  # the metric's description
    assert "Evaluations per candidate: scored, errored, timed out" in page
    detailed = json.loads(files["detailed_results.json"])
    assert detailed["evaluations_failed"] == 2 and detailed["top_errors"][0]["count"] == 1


def test_ties_break_by_latency_then_cost_and_constant_cost_plots_latency():
    evals = [
        Evaluation("slow", 0, "a", 0.5, latency_ms=900, cost_usd=0.0),
        Evaluation("fast", 0, "a", 0.5, latency_ms=100, cost_usd=0.0),
    ]
    r = RunResults(
        run_id="run-t",
        name="",
        config={},
        candidates=[Candidate("slow", 0, {"t": 1}), Candidate("fast", 0, {"t": 2})],
        evaluations=evals,
    )
    assert [s.candidate_id for s in summarize(r)] == ["fast", "slow"]
    page = render(r)["report.html"].decode()
    assert "Quality against latency (cost is the same for every candidate" in page


def test_best_so_far_never_rises_above_the_best_fully_evaluated_candidate():
    # c4 was raced out after one lucky case (1.0): its mean is not comparable to c2's 0.9 over two.
    base = results()
    raced = RunResults(
        run_id=base.run_id,
        name=base.name,
        config=base.config,
        candidates=[*base.candidates, Candidate("c4", 1, {"model": "large", "temperature": 1.0})],
        evaluations=[*base.evaluations, Evaluation("c4", 1, "case-0", 1.0, latency_ms=100, cost_usd=0.01)],
    )
    files = render(raced)
    assert json.loads(files["best_config.json"])["mean_score"] == 0.9
    assert json.loads(files["detailed_results.json"])["best_so_far"] == [[0, 0.9], [1, 0.9]]
