"""A finished run's four result files: best_config.json, detailed_results.json, report.md
and report.html (plots embedded as PNG, so the page is one self-contained file).

Pure: takes the run's evaluations, returns bytes. The run driver writes them to the object
store; the CLI downloads them.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import textwrap
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Evaluation:
    """One config on one test case."""

    candidate_id: str
    generation: int
    test_case_id: str
    score: float
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    output: str = ""
    error: str = ""


@dataclass(frozen=True)
class Candidate:
    """A config the search proposed, with where it came from."""

    candidate_id: str
    generation: int
    config: dict[str, Any]
    origin: str = "search"  # search, warm_start, injected, elite


@dataclass
class CandidateSummary:
    candidate_id: str
    generation: int
    config: dict[str, Any]
    origin: str
    mean_score: float
    cases: int
    errors: int
    mean_latency_ms: float
    mean_cost_usd: float
    pareto: bool = False
    timeouts: int = 0
    top_error: str = ""


@dataclass(frozen=True)
class RunResults:
    run_id: str
    name: str
    config: dict[str, Any]
    candidates: list[Candidate]
    evaluations: list[Evaluation]
    state: str = "succeeded"
    stopped_because: str = ""
    # The search's pick (its posterior, fully evaluated candidates first); "" lets the
    # ranking below decide.
    best_candidate_id: str = ""
    error: str = ""  # why the run failed
    warnings: tuple[str, ...] = ()  # config fields read but not acted on


@dataclass(frozen=True)
class Outcome:
    """How many evaluations failed, and with what."""

    total: int
    failed: int
    timed_out: int
    top_errors: list[tuple[str, int]]  # (message, count), most frequent first

    def line(self) -> str:
        if not self.failed:
            return f"0 of {self.total} evaluations failed"
        return f"{self.failed} of {self.total} evaluations failed ({self.timed_out} timed out)"


# The rule behind "cases" < the test-case count, in one line for the reports.
RACING_RULE = (
    "Racing: each candidate is scored on a few test cases first and on more only while it may still "
    "beat the best (confidence {confidence:g}); candidates dropped early show fewer cases and rank "
    "after fully scored ones."
)


def is_timeout(error: str) -> bool:
    return "timed out" in error.lower() or "timeout" in error.lower()


def _error_key(error: str) -> str:
    # "... (attempt 3 of 3)" differs per evaluation only in noise; group by the message
    return error.split(" (attempt ")[0].strip()[:300]


def outcome(results: RunResults, top: int = 5) -> Outcome:
    """The run's failed evaluations: counts and the most common messages."""
    errors = [e.error for e in results.evaluations if e.error]
    counts: dict[str, int] = defaultdict(int)
    for e in errors:
        counts[_error_key(e)] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return Outcome(len(results.evaluations), len(errors), sum(1 for e in errors if is_timeout(e)), ranked)


def summarize(results: RunResults) -> list[CandidateSummary]:
    """Per-candidate means, best first; Pareto-optimal ones (quality up, cost and latency
    down) marked."""
    by_candidate: dict[str, list[Evaluation]] = defaultdict(list)
    for e in results.evaluations:
        by_candidate[e.candidate_id].append(e)
    out = []
    for c in results.candidates:
        evals = by_candidate.get(c.candidate_id, [])
        if not evals:
            continue
        n = len(evals)
        out.append(
            CandidateSummary(
                candidate_id=c.candidate_id,
                generation=c.generation,
                config=c.config,
                origin=c.origin,
                mean_score=sum(e.score for e in evals) / n,
                cases=n,
                errors=sum(1 for e in evals if e.error),
                mean_latency_ms=sum(e.latency_ms for e in evals) / n,
                mean_cost_usd=sum(e.cost_usd for e in evals) / n,
                timeouts=sum(1 for e in evals if e.error and is_timeout(e.error)),
                top_error=_top([_error_key(e.error) for e in evals if e.error]),
            )
        )
    for s in out:
        s.pareto = not any(_dominates(o, s) for o in out if o is not s)
    # Candidates scored on every test case first (racing stops the others early, and a mean
    # over a few cases is optimistic), then by mean score; equal scores by latency, then cost.
    full = max((s.cases for s in out), default=0)
    out.sort(
        key=lambda s: (
            s.cases < full,
            -round(s.mean_score, 9),
            s.mean_latency_ms,
            s.mean_cost_usd,
            -s.cases,
            s.candidate_id,
        )
    )
    return out


def _top(messages: list[str]) -> str:
    if not messages:
        return ""
    counts: dict[str, int] = defaultdict(int)
    for m in messages:
        counts[m] += 1
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _dominates(a: CandidateSummary, b: CandidateSummary) -> bool:
    no_worse = (
        a.mean_score >= b.mean_score and a.mean_cost_usd <= b.mean_cost_usd and a.mean_latency_ms <= b.mean_latency_ms
    )
    better = a.mean_score > b.mean_score or a.mean_cost_usd < b.mean_cost_usd or a.mean_latency_ms < b.mean_latency_ms
    return no_worse and better


def best_so_far(results: RunResults) -> list[tuple[int, float]]:
    """(generation, best mean score among the fully evaluated candidates seen up to it).

    Racing drops a candidate after a few cases, and a mean over three lucky cases can beat the
    best config's mean over all of them: counting those would draw a curve above the result the
    run reports. A generation whose candidates were all dropped early carries the best forward."""
    summaries = summarize(results)
    if not summaries:
        return []
    full = max(s.cases for s in summaries)
    out, best = [], -math.inf
    for g in sorted({s.generation for s in summaries}):
        best = max([best, *(s.mean_score for s in summaries if s.generation == g and s.cases >= full)])
        if math.isfinite(best):
            out.append((g, best))
    return out


def render(results: RunResults) -> dict[str, bytes]:
    """The four files, by name."""
    summaries = summarize(results)
    best = next((s for s in summaries if s.candidate_id == results.best_candidate_id), None) or (
        summaries[0] if summaries else None
    )
    if best is not None and summaries and summaries[0] is not best:
        summaries = [best, *(s for s in summaries if s is not best)]
    best_config = {
        "run_id": results.run_id,
        "config": best.config if best else {},
        "mean_score": best.mean_score if best else None,
        "test_cases": best.cases if best else 0,
        "candidate_id": best.candidate_id if best else None,
    }
    failures = outcome(results)
    detailed = {
        "run_id": results.run_id,
        "name": results.name,
        "state": results.state,
        "error": results.error,
        "stopped_because": results.stopped_because,
        "evaluations_failed": failures.failed,
        "evaluations_timed_out": failures.timed_out,
        "top_errors": [{"message": m, "count": n} for m, n in failures.top_errors],
        "warnings": list(results.warnings),
        "run_config": results.config,
        "candidates": [asdict(s) for s in summaries],
        "evaluations": [asdict(e) for e in results.evaluations],
        "best_so_far": best_so_far(results),
    }
    return {
        "best_config.json": _json(best_config),
        "detailed_results.json": _json(detailed),
        "report.md": _markdown(results, summaries, failures).encode(),
        "report.html": _html(results, summaries, failures).encode(),
    }


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=False, default=str) + "\n").encode()


def _param_names(summaries: list[CandidateSummary]) -> list[str]:
    return sorted({k for s in summaries for k in s.config})


def _racing_line(results: RunResults) -> str:
    racing = (
        ((results.config.get("optimization") or {}).get("racing") or {}) if isinstance(results.config, dict) else {}
    )
    if isinstance(racing, dict) and racing.get("enabled") is False:
        return "Racing was off: every candidate was scored on every test case."
    confidence = racing.get("confidence", 0.9) if isinstance(racing, dict) else 0.9
    return RACING_RULE.format(confidence=float(confidence) if isinstance(confidence, int | float) else 0.9)


def _metric_notes(results: RunResults) -> list[tuple[str, str]]:
    """(metric, description) for the metrics the config describes (The Convergence's field)."""
    evaluation = results.config.get("evaluation") if isinstance(results.config, dict) else None
    metrics = evaluation.get("metrics") if isinstance(evaluation, dict) else None
    if not isinstance(metrics, dict):
        return []
    return [
        (str(name), str(spec["description"]))
        for name, spec in metrics.items()
        if isinstance(spec, dict) and spec.get("description")
    ]


def _markdown(results: RunResults, summaries: list[CandidateSummary], failures: Outcome) -> str:
    lines = [
        f"# Run {results.name or results.run_id}",
        "",
        f"- run id: `{results.run_id}`",
        f"- state: **{results.state}**" + (f" ({results.stopped_because})" if results.stopped_because else ""),
    ]
    if results.error:
        lines.append(f"- why it failed: {results.error}")
    lines += [
        f"- candidates evaluated: {len(summaries)}; test-case evaluations: {len(results.evaluations)}",
        f"- failures: **{failures.line()}**",
    ]
    if failures.top_errors:
        lines += ["", "## Errors", "", "| count | error |", "|---|---|"]
        lines += [f"| {n} | {_cell(m)} |" for m, n in failures.top_errors]
    if results.warnings:
        lines += ["", "## Config warnings", ""] + [f"- {w}" for w in results.warnings]
    notes = _metric_notes(results)
    if notes:
        lines += ["", "## Metrics", ""] + [f"- `{name}`: {text}" for name, text in notes]
    if summaries and results.state == "failed":
        lines += ["", "No best config: the run failed."]
    elif summaries:
        b = summaries[0]
        lines += [
            "",
            f"Best mean score: **{b.mean_score:.4f}** over {b.cases} test cases (candidate `{b.candidate_id}`)"
            + (f", {b.errors} of them failed" if b.errors else ""),
            "",
            "## Best config",
            "",
            "```json",
            json.dumps(b.config, indent=2, default=str),
            "```",
        ]
    lines += ["", "## Best so far per generation", "", "| generation | best mean score |", "|---|---|"]
    lines += [f"| {g} | {s:.4f} |" for g, s in best_so_far(results)]
    params = _param_names(summaries)
    lines += [
        "",
        "## Top candidates",
        "",
        _racing_line(results) + " Equal scores are ranked by latency, then cost.",
        "",
        "| rank | candidate | gen | origin | mean score | cases | errors | timeouts | latency ms | cost $ | Pareto | "
        + " | ".join(params)
        + " | top error |",
        "|---" * (12 + len(params)) + "|",
    ]
    for i, s in enumerate(summaries[:20], 1):
        values = " | ".join(_cell(s.config.get(p)) for p in params)
        lines.append(
            f"| {i} | `{s.candidate_id}` | {s.generation} | {s.origin} | {s.mean_score:.4f} | {s.cases} | "
            f"{s.errors} | {s.timeouts} | {s.mean_latency_ms:.0f} | {s.mean_cost_usd:.5f} | "
            f"{'yes' if s.pareto else ''} | {values} | {_cell(s.top_error[:120])} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ") if value is not None else ""


def _html(results: RunResults, summaries: list[CandidateSummary], failures: Outcome) -> str:
    plots = _plots(results, summaries)
    esc = html.escape
    rows = "".join(
        "<tr"
        + (' class="failing"' if s.errors else "")
        + ">"
        + "".join(
            f"<td>{esc(str(v))}</td>"
            for v in (
                i,
                s.candidate_id,
                s.generation,
                s.origin,
                f"{s.mean_score:.4f}",
                s.cases,
                s.errors,
                s.timeouts,
                f"{s.mean_latency_ms:.0f}",
                f"{s.mean_cost_usd:.5f}",
                "yes" if s.pareto else "",
                json.dumps(s.config, default=str),
                s.top_error[:200],
            )
        )
        + "</tr>"
        for i, s in enumerate(summaries[:50], 1)
    )
    figures = "".join(
        f'<figure><img alt="{esc(title)}" title="{esc(title)}" src="data:image/png;base64,{png}"/></figure>'
        for title, png in plots
    )
    best = summaries[0] if summaries else None
    headline = (
        f"Best mean score <b>{best.mean_score:.4f}</b> over {best.cases} test cases"
        f"<pre>{esc(json.dumps(best.config, indent=2, default=str))}</pre>"
        if best and results.state != "failed"
        else "No best config: the run failed."
        if best
        else "No candidate was evaluated."
    )
    failed_box = ""
    if results.error or failures.failed:
        items = "".join(f"<li><b>{n} x</b> <code>{esc(m)}</code></li>" for m, n in failures.top_errors)
        failed_box = (
            f'<section id="failures" class="{"bad" if results.state == "failed" else "warn"}">'
            + (f"<p><b>Run failed:</b> {esc(results.error)}</p>" if results.error else "")
            + f'<p id="failure-count"><b>{esc(failures.line())}</b></p>'
            + (f"<p>Most common errors:</p><ol>{items}</ol>" if items else "")
            + "</section>"
        )
    warnings = (
        "<h2>Config warnings</h2><ul>" + "".join(f"<li>{esc(w)}</li>" for w in results.warnings) + "</ul>"
        if results.warnings
        else ""
    )
    notes = _metric_notes(results)
    if notes:
        warnings += "<h2>Metrics</h2><ul>" + "".join(f"<li><code>{esc(n)}</code>: {esc(t)}</li>" for n, t in notes)
        warnings += "</ul>"
    title = esc(results.name or results.run_id)
    stopped = f" ({esc(results.stopped_because)})" if results.stopped_because else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flywheel run {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;font-size:.85em}}td,th{{border:1px solid #ccc;padding:.25em .5em;vertical-align:top}}
td:nth-child(12),td:nth-child(13){{max-width:24em;overflow-wrap:anywhere}}
tr.failing td:nth-child(7){{color:#a00;font-weight:bold}}
section.bad{{border:2px solid #c00;background:#fff0f0;padding:.5em 1em}}
section.warn{{border:2px solid #c80;background:#fff8e8;padding:.5em 1em}}
figure{{display:inline-block;margin:.5em;vertical-align:top}}img{{max-width:560px}}</style></head><body>
<h1>Run {title}</h1>
<p>State: <b id="state">{esc(results.state)}</b>{stopped}
· candidates: {len(summaries)}
· test-case evaluations: {len(results.evaluations)} · {esc(failures.line())}</p>
{failed_box}
<p>{headline}</p>
{warnings}
{figures}
<h2>Top candidates</h2>
<p>{esc(_racing_line(results))} Equal scores are ranked by latency, then cost.</p>
<table><tr><th>rank</th><th>candidate</th><th>gen</th><th>origin</th><th>mean score</th><th>cases</th>
<th>errors</th><th>timeouts</th><th>latency ms</th><th>cost $</th><th>Pareto</th><th>config</th>
<th>top error</th></tr>{rows}</table>
</body></html>
"""


def _wrap(label: str, width: int = 14) -> str:
    return "\n".join(textwrap.wrap(label, width, break_long_words=True)) or label


def _plots(results: RunResults, summaries: list[CandidateSummary]) -> list[tuple[str, str]]:
    """(title, base64 PNG) for each plot; empty when there is nothing to draw."""
    if not summaries:
        return []
    import matplotlib  # only the report needs it, and only headless

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = []

    def emit(title: str, fig: Any) -> None:
        # the title on the plot itself: a caption under it read as the next plot's
        fig.axes[0].set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        out.append((title, base64.b64encode(buf.getvalue()).decode()))

    curve = best_so_far(results)
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot([g for g, _ in curve], [s for _, s in curve], marker="o")
    ax.set_xlabel("generation")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("best mean score so far")
    emit("Best so far per generation", fig)

    by_gen: dict[int, list[float]] = defaultdict(list)
    for s in summaries:
        by_gen[s.generation].append(s.mean_score)
    gens = sorted(by_gen)
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.boxplot([by_gen[g] for g in gens], tick_labels=[str(g) for g in gens])
    ax.set_xlabel("generation")
    ax.set_ylabel("candidate mean score")
    emit("Score distribution per generation", fig)

    # One readable panel per parameter (a grid of small ones was unreadable at 100%)
    for p in _param_names(summaries):
        xs = [s.config.get(p) for s in summaries]
        ys = [s.mean_score for s in summaries]
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        if all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs):
            ax.scatter(xs, ys, s=22, alpha=0.7)
        else:
            labels = sorted({json.dumps(x, default=str) if not isinstance(x, str) else x for x in xs})
            key = [json.dumps(x, default=str) if not isinstance(x, str) else x for x in xs]
            ax.boxplot([[y for k, y in zip(key, ys, strict=True) if k == v] for v in labels])
            ax.set_xticks(range(1, len(labels) + 1), [_wrap(v) for v in labels], fontsize=9)
        ax.set_xlabel(p)
        ax.set_ylabel("candidate mean score")
        emit(f"Effect of {p} (candidate mean score)", fig)

    failing = [s for s in summaries if s.errors]
    if failing:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        ids = [s.candidate_id for s in summaries[:30]]
        ok = [s.cases - s.errors for s in summaries[:30]]
        timeouts = [s.timeouts for s in summaries[:30]]
        other = [s.errors - s.timeouts for s in summaries[:30]]
        ax.bar(range(len(ids)), ok, label="scored", color="#4c72b0")
        ax.bar(range(len(ids)), other, bottom=ok, label="errored", color="#c44e52")
        ax.bar(
            range(len(ids)),
            timeouts,
            bottom=[a + b for a, b in zip(ok, other, strict=True)],
            label="timed out",
            color="#dd8452",
        )
        ax.set_xticks(range(len(ids)), [str(i + 1) for i in range(len(ids))], fontsize=8)
        ax.set_xlabel("candidate rank")
        ax.set_ylabel("evaluations")
        ax.legend(loc="upper right", fontsize=8)
        emit("Evaluations per candidate: scored, errored, timed out", fig)

    cost = [s.mean_cost_usd for s in summaries]
    score = [s.mean_score for s in summaries]
    latency = [s.mean_latency_ms for s in summaries]
    if max(cost) - min(cost) <= 1e-12:
        # Cost is the same for every candidate (a local model): latency is the trade-off
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        ax.scatter(latency, score, s=22)
        optimal = [s for s in summaries if s.pareto]
        ax.scatter(
            [s.mean_latency_ms for s in optimal],
            [s.mean_score for s in optimal],
            marker="x",
            color="red",
            s=50,
            label="Pareto-optimal",
        )
        ax.set_xlabel("mean latency per test case (ms)")
        ax.set_ylabel("mean score")
        ax.legend(loc="lower right")
        emit(f"Quality against latency (cost is the same for every candidate: ${cost[0]:.5f})", fig)
        return out
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    points = ax.scatter(cost, score, c=latency, cmap="viridis", s=18)
    # Red crosses: Pareto-optimal on all three objectives. Step line: the quality-cost front.
    optimal = [s for s in summaries if s.pareto]
    ax.scatter([s.mean_cost_usd for s in optimal], [s.mean_score for s in optimal], marker="x", color="red", s=40)
    front, top = [], -math.inf
    for s in sorted(summaries, key=lambda s: (s.mean_cost_usd, -s.mean_score)):
        if s.mean_score > top:
            front.append(s)
            top = s.mean_score
    ax.step(
        [s.mean_cost_usd for s in front],
        [s.mean_score for s in front],
        where="post",
        color="red",
        label="Pareto (x: with latency)",
    )
    fig.colorbar(points, ax=ax, label="mean latency ms")
    ax.set_xlabel("mean cost per test case ($)")
    ax.set_ylabel("mean score")
    ax.legend(loc="lower right")
    emit("Quality, cost and latency: the Pareto front", fig)
    return out
