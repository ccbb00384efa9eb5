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
            )
        )
    for s in out:
        s.pareto = not any(_dominates(o, s) for o in out if o is not s)
    # Candidates scored on every test case first (racing stops the others early, and a mean
    # over a few cases is optimistic), then by mean score.
    full = max((s.cases for s in out), default=0)
    out.sort(key=lambda s: (s.cases < full, -s.mean_score, -s.cases, s.candidate_id))
    return out


def _dominates(a: CandidateSummary, b: CandidateSummary) -> bool:
    no_worse = (
        a.mean_score >= b.mean_score and a.mean_cost_usd <= b.mean_cost_usd and a.mean_latency_ms <= b.mean_latency_ms
    )
    better = a.mean_score > b.mean_score or a.mean_cost_usd < b.mean_cost_usd or a.mean_latency_ms < b.mean_latency_ms
    return no_worse and better


def best_so_far(results: RunResults) -> list[tuple[int, float]]:
    """(generation, best mean score among candidates seen up to it), fully evaluated or not."""
    summaries = summarize(results)
    generations = sorted({s.generation for s in summaries})
    out, best = [], -math.inf
    for g in generations:
        best = max([best, *(s.mean_score for s in summaries if s.generation == g)])
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
    detailed = {
        "run_id": results.run_id,
        "name": results.name,
        "state": results.state,
        "stopped_because": results.stopped_because,
        "run_config": results.config,
        "candidates": [asdict(s) for s in summaries],
        "evaluations": [asdict(e) for e in results.evaluations],
        "best_so_far": best_so_far(results),
    }
    return {
        "best_config.json": _json(best_config),
        "detailed_results.json": _json(detailed),
        "report.md": _markdown(results, summaries).encode(),
        "report.html": _html(results, summaries).encode(),
    }


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=False, default=str) + "\n").encode()


def _param_names(summaries: list[CandidateSummary]) -> list[str]:
    return sorted({k for s in summaries for k in s.config})


def _markdown(results: RunResults, summaries: list[CandidateSummary]) -> str:
    lines = [
        f"# Run {results.name or results.run_id}",
        "",
        f"- run id: `{results.run_id}`",
        f"- state: {results.state}" + (f" ({results.stopped_because})" if results.stopped_because else ""),
        f"- candidates evaluated: {len(summaries)}; test-case evaluations: {len(results.evaluations)}",
    ]
    if summaries:
        b = summaries[0]
        lines += [
            f"- best mean score: **{b.mean_score:.4f}** over {b.cases} test cases (candidate `{b.candidate_id}`)",
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
        "| rank | candidate | gen | origin | mean score | cases | latency ms | cost $ | Pareto | "
        + " | ".join(params)
        + " |",
        "|---" * (9 + len(params)) + "|",
    ]
    for i, s in enumerate(summaries[:20], 1):
        values = " | ".join(_cell(s.config.get(p)) for p in params)
        lines.append(
            f"| {i} | `{s.candidate_id}` | {s.generation} | {s.origin} | {s.mean_score:.4f} | {s.cases} | "
            f"{s.mean_latency_ms:.0f} | {s.mean_cost_usd:.5f} | {'yes' if s.pareto else ''} | {values} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|") if value is not None else ""


def _html(results: RunResults, summaries: list[CandidateSummary]) -> str:
    plots = _plots(results, summaries)
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                i,
                s.candidate_id,
                s.generation,
                s.origin,
                f"{s.mean_score:.4f}",
                s.cases,
                f"{s.mean_latency_ms:.0f}",
                f"{s.mean_cost_usd:.5f}",
                "yes" if s.pareto else "",
                json.dumps(s.config, default=str),
            )
        )
        + "</tr>"
        for i, s in enumerate(summaries[:50], 1)
    )
    figures = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{png}"/>'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for title, png in plots
    )
    best = summaries[0] if summaries else None
    headline = (
        f"Best mean score <b>{best.mean_score:.4f}</b> over {best.cases} test cases"
        f"<pre>{html.escape(json.dumps(best.config, indent=2, default=str))}</pre>"
        if best
        else "No candidate was evaluated."
    )
    title = html.escape(results.name or results.run_id)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flywheel run {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;font-size:.85em}}td,th{{border:1px solid #ccc;padding:.25em .5em}}
figure{{display:inline-block;margin:.5em}}img{{max-width:520px}}</style></head><body>
<h1>Run {title}</h1>
<p>State: {html.escape(results.state)} {html.escape(results.stopped_because)} · candidates: {len(summaries)}
· test-case evaluations: {len(results.evaluations)}</p>
<p>{headline}</p>
{figures}
<h2>Top candidates</h2>
<table><tr><th>rank</th><th>candidate</th><th>gen</th><th>origin</th><th>mean score</th><th>cases</th>
<th>latency ms</th><th>cost $</th><th>Pareto</th><th>config</th></tr>{rows}</table>
</body></html>
"""


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
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
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

    params = _param_names(summaries)
    if params:
        cols = min(3, len(params))
        rows = math.ceil(len(params) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
        for ax, p in zip(axes.flat, params, strict=False):
            xs = [s.config.get(p) for s in summaries]
            ys = [s.mean_score for s in summaries]
            if all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs):
                ax.scatter(xs, ys, s=12, alpha=0.7)
            else:
                labels = sorted({str(x) for x in xs})
                ax.boxplot([[y for x, y in zip(xs, ys, strict=True) if str(x) == v] for v in labels])
                ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, fontsize=7)
            ax.set_title(p, fontsize=9)
        for ax in list(axes.flat)[len(params) :]:
            ax.axis("off")
        emit("Parameter effects (candidate mean score)", fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    cost = [s.mean_cost_usd for s in summaries]
    score = [s.mean_score for s in summaries]
    latency = [s.mean_latency_ms for s in summaries]
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
