"""The demo report (flywheel.stack.story.report) seen by a real browser: a realistic record
with every stage filled renders every plot in headless Chromium with no console error and a
screenshot that is not blank; a record whose stages did not run says so and still renders;
the CLI rebuilds the same page from a saved record. No stack needed: the record is built here."""

from __future__ import annotations

import ast
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.stack.browser import check_report_in_browser
from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.report import NOT_RUN, main, plot_count, render, write_report
from flywheel.stack.story.verdict import verdict

pytestmark = pytest.mark.timeout(120)

RUN_ID = "run-5f2c9a1e"
POLICY_ID = "pol-0c41d7b2e9"
JOB_ID = "job-7a3e55f0"
CANARY_ARM = "arm-policy-v1"
PLOTS_FULL = 7  # stage 1: curve + SAO; stage 2: shares + posteriors; training; canary; lineage


def realistic_record(decision: str = "promoted") -> StoryRecord:
    """What a demo run records, with plausible figures (seeded)."""
    rng = random.Random(3)
    curve, best = [], -math.inf
    for i in range(1, 25):
        origin = "rlp" if i % 4 == 0 else "search"
        score = min(0.95, 0.45 + 0.015 * i + rng.uniform(-0.12, 0.08) + (0.04 if origin == "rlp" else 0))
        best = max(best, score)
        curve.append({"evaluation": i, "score": round(score, 4), "best": round(best, 4), "origin": origin})
    arms = [
        {
            "arm_id": "arm-a1",
            "params": {"temperature": 0.2, "prompt": "concise"},
            "true_rate": 0.72,
            "batch_score": 0.81,
        },
        {
            "arm_id": "arm-b2",
            "params": {"temperature": 0.7, "prompt": "friendly"},
            "true_rate": 0.55,
            "batch_score": 0.77,
        },
        {
            "arm_id": "arm-c3",
            "params": {"temperature": 1.0, "prompt": "verbose"},
            "true_rate": 0.40,
            "batch_score": 0.7,
        },
    ]
    post = {a["arm_id"]: [1.0, 1.0] for a in arms}
    timeline = []
    for d in range(20, 301, 20):
        means = {k: a / (a + b) for k, (a, b) in post.items()}
        top = max(means, key=means.get)
        shares = {k: (0.6 if k == top else 0.2) for k in post}
        for arm in arms:
            n = round(20 * shares[arm["arm_id"]])
            wins = sum(rng.random() < arm["true_rate"] for _ in range(n))
            post[arm["arm_id"]][0] += wins
            post[arm["arm_id"]][1] += n - wins
        timeline.append(
            {
                "decision": d,
                "shares": shares,
                "posterior": {k: {"alpha": a, "beta": b, "mean": a / (a + b)} for k, (a, b) in post.items()},
            }
        )
    traces = [f"trace-{i:04d}" for i in range(12)]
    canary_timeline, ca, cb, ia, ib = [], 1.0, 1.0, 40.0, 16.0
    for d in range(10, 151, 10):
        ca, cb = ca + 7 * 0.5, cb + 3 * 0.5
        p = min(0.99, 0.5 + d / 320)
        canary_timeline.append(
            {
                "decision": d,
                "p_better": round(p, 3),
                "canary_share": round(0.2 + d / 600, 3),
                "canary": {"alpha": ca, "beta": cb},
                "incumbent": {"arm_id": "arm-a1", "alpha": ia, "beta": ib},
            }
        )
    lineage = [{"kind": "trace", "id": t, "from": []} for t in traces]
    lineage += [
        {"kind": "trace_dataset", "id": "export-91b2", "from": traces},
        {"kind": "sao_dataset", "id": "sao-ds-44c1", "from": []},
        {"kind": "dataset", "id": "ds-dpo-3e8f", "from": ["export-91b2", "sao-ds-44c1"]},
        {"kind": "job", "id": JOB_ID, "from": ["ds-dpo-3e8f"]},
        {"kind": "policy", "id": POLICY_ID, "from": [JOB_ID]},
        {"kind": "arm", "id": CANARY_ARM, "from": [POLICY_ID]},
        {"kind": "decision", "id": "dec-001a", "from": [CANARY_ARM]},
        {"kind": "decision", "id": "dec-001b", "from": [CANARY_ARM]},
    ]
    return StoryRecord(
        meta={
            "commit": "edb80c7",
            "command": "./dev demo",
            "started_at": "2026-11-24T14:00:00Z",
            "seconds": 412.6,
            "stage_seconds": {"optimize": 150.3, "traffic": 90.1, "training": 101.7, "canary": 64.0},
            "machine": {"platform": "Linux-6.1-x86_64-with-glibc2.36", "python": "3.11.2", "cpus": 2},
            "sizes": {"test_cases": 8, "population": 4, "generations": 3, "traffic_decisions": 300},
            "models": {"served": "SmolLM2-135M-Instruct", "trainer_base": "smollm2"},
        },
        optimize={
            "run_id": RUN_ID,
            "state": "succeeded",
            "seconds": 141.2,
            "evaluations": 96,
            "evaluations_failed": 2,
            "best_score": best,
            "best_config": {"temperature": 0.2, "prompt": "concise", "max_tokens": 256},
            "curve": curve,
            "rlp": {
                "steps": 6,
                "steps_failed": 1,
                "failures": {"unparseable": 1},
                "proposals": 5,
                "proposals_resolved": 5,
                "hit_rate": 0.6,
                "mean_reward": 0.113,
                "reward_definitions": {"logprob_information_gain": 5},
            },
            "sao": {
                "round_id": "sao-r-77",
                "dataset_id": "sao-ds-44c1",
                "manifest_uri": "s3://flywheel/datasets/sao-ds-44c1/manifest.json",
                "pairs": 9,
                "attempted": 14,
                "dropped": {"identical_responses": 3, "too_short": 1, "judge_tie": 1},
                "state": "succeeded",
            },
        },
        traffic={
            "endpoint": "support-assistant",
            "seconds": 88.4,
            "decisions": 300,
            "feedback_sent": 300,
            "feedback_applied": 300,
            "traces": 300,
            "arms": arms,
            "timeline": timeline,
            "verdict": verdict(arms, timeline[-1]["posterior"]),
        },
        training={
            "seconds": 96.0,
            "trace_pairs": 12,
            "sao_pairs": 9,
            "trace_dataset_uri": "s3://flywheel/exports/export-91b2.jsonl",
            "source_traces": traces,
            "dataset_id": "ds-dpo-3e8f",
            "dataset_manifest_uri": "s3://flywheel/datasets/ds-dpo-3e8f/manifest.json",
            "job_id": JOB_ID,
            "job_state": "succeeded",
            "base_model": "smollm2",
            "steps": [
                {"step": s, "loss": 0.693 - 0.05 * s, "reward_margin": 0.02 * s, "learning_rate": 5e-5}
                for s in range(1, 5)
            ],
            "policy_id": POLICY_ID,
            "policy_name": "support-assistant",
            "version": 1,
            "arm_id": CANARY_ARM,
            "served_model": "support-assistant-v1",
        },
        canary={
            "seconds": 61.3,
            "arm_id": CANARY_ARM,
            "decisions": 150,
            "canary_decisions": 58,
            "incumbent": "arm-a1",
            "incumbent_true_rate": 0.72,
            "decision": decision,
            "arm_status": "promoted" if decision == "promoted" else "retired",
            "policy_status": "active" if decision == "promoted" else "rolled_back",
            "true_rate": 0.8,
            "timeline": canary_timeline,
        },
        lineage=lineage,
    )


async def test_a_full_report_renders_every_plot_in_chromium(tmp_path: Path) -> None:
    record = realistic_record()
    page = write_report(record, tmp_path / "demo-report.html")
    text = page.read_text()
    # Self-contained: nothing fetched, no script
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text) and "<script" not in text
    assert plot_count(record) == PLOTS_FULL

    seen = await check_report_in_browser(page, tmp_path)

    assert seen["problems"] == [], seen["problems"]
    assert seen["errors"] == []
    assert len(seen["images"]) == seen["plots"] == PLOTS_FULL, seen["images"]
    assert all(w > 0 for w in seen["images"]), seen["images"]
    assert seen["empty_plots"] == 0
    assert seen["ink"] > 0.05 and seen["colours"] > 50, (seen["ink"], seen["colours"])
    for figure in ("promoted", POLICY_ID, RUN_ID, JOB_ID, CANARY_ARM, "edb80c7", "./dev demo", "2.5 min (150 s)"):
        assert figure in seen["text"], figure
    assert NOT_RUN not in seen["text"]
    assert "Flywheel searched the support assistant's config over 96 evaluations" in seen["text"]
    assert "trace: 12 nodes" in seen["text"]  # the source traces fold under their count
    assert "P(best)" in seen["text"] and "At the end, the bandit favours" in seen["text"]  # the traffic's verdict


async def test_stages_not_run_and_empty_data_render_without_errors(tmp_path: Path) -> None:
    bare = StoryRecord(meta={"commit": "abc123", "seconds": 3.0, "stage_seconds": {"optimize": 12.5}})
    page = write_report(bare, tmp_path / "bare" / "demo-report.html")
    seen = await check_report_in_browser(page, tmp_path / "bare")
    assert seen["errors"] == [] and seen["images"] == []
    assert seen["text"].count(NOT_RUN) >= 4 + 3  # each stage's section, and the time rows of those not started
    assert "failed after 12.5 s" in seen["text"]  # started, left no section
    assert f"{NOT_RUN}: it started and stopped after 12.5 s without a result" in seen["text"]
    assert "no lineage recorded" in seen["text"]
    assert seen["problems"] == ["no plot on the page"]  # the verdict still says why it is thin

    # Stages that ran but recorded nothing to draw: each plot says so instead of failing
    thin = realistic_record(decision="rolled_back")
    thin.optimize = {**thin.optimize, "curve": [], "sao": {"pairs": 0, "attempted": 0, "dropped": {}}}
    thin.traffic = {**thin.traffic, "timeline": []}
    thin.training = {**thin.training, "steps": []}
    thin.canary = {**thin.canary, "timeline": []}
    page = render(thin)
    assert page.count('class="plot"') == 1 and page.count('class="plot-empty"') == PLOTS_FULL - 1  # lineage drawn
    for note in ("no evaluation was recorded", "the round attempted no pairs", "no traffic timeline was recorded"):
        assert note in page, note
    assert "After 150 more decisions the bandit rolled it back" in page


def test_a_malformed_section_costs_its_plot_not_the_report() -> None:
    record = realistic_record()
    record.traffic["timeline"][3]["posterior"]["arm-a1"] = {"alpha": "many", "beta": None}
    record.canary["timeline"] = [{"decision": "x"}]
    page = render(record)  # no exception
    assert page.count('class="plot"') + page.count('class="plot-empty"') == PLOTS_FULL
    assert "no canary timeline was recorded" in page


def test_the_cli_rebuilds_the_report_from_a_saved_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = realistic_record().save(tmp_path / "record.json")
    out = tmp_path / "again.html"
    done = subprocess.run(
        [sys.executable, "-m", "flywheel.stack.story.report", str(saved), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out.resolve())
    assert out.read_text() == render(StoryRecord.load(saved))
    assert POLICY_ID in out.read_text()

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main([str(bad)]) == 2  # in process: a second interpreter would only cost time
    assert "cannot read the record" in capsys.readouterr().err


def test_the_default_thresholds_are_the_storys_canary_rule() -> None:
    # The canary section may omit the rule; the plot then draws the one the story sets. Read
    # from traffic.py's source: importing it pulls litellm (half a minute on a busy machine).
    from flywheel.stack.story import plots

    rule = next(
        node.value
        for node in ast.walk(ast.parse(Path(plots.__file__).with_name("traffic.py").read_text()))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CANARY_RULE" for t in node.targets)
    )
    assert isinstance(rule, ast.Call)
    given = {k.arg: ast.literal_eval(k.value) for k in rule.keywords}
    assert given["promote_probability"] == plots.PROMOTE_PROBABILITY
    assert given["retire_probability"] == plots.RETIRE_PROBABILITY
