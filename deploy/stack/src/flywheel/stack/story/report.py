"""The demo's HTML report (``demo-report.html``): what each stage of the story did, with its
figures as small tables and its plots, in one self-contained file (PNG plots embedded as
base64, no script, nothing fetched), so it opens anywhere, offline.

``write_report(record, path)`` is what ``./dev demo`` and the end-to-end test call; from a
saved record: ``python -m flywheel.stack.story.report record.json [-o demo-report.html]``.
A stage that did not run shows "stage not run"; a plot with no data says so in its place."""

from __future__ import annotations

import argparse
import html
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flywheel.stack.story import plots
from flywheel.stack.story.plots import Plot, guard, params_text, short
from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.verdict import verdict_text

STAGES = (
    ("optimize", "1. Batch optimization"),
    ("traffic", "2. Product traffic on the best configs"),
    ("training", "3. Training a policy from traces and SAO pairs"),
    ("canary", "4. The canary: promote or roll back"),
)
NOT_RUN = "stage not run"
MAX_STEP_ROWS = 20  # training steps listed in the table
LINEAGE_FROM_SHOWN = 8  # parents listed per node in the chain table (all traces are listed below it)

esc = html.escape


def write_report(record: StoryRecord, path: Path) -> Path:
    """Write the report of ``record`` to ``path`` (parents created) and return ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(record), encoding="utf-8")
    return path


def render(record: StoryRecord) -> str:
    """The report's HTML."""
    timed = record.meta.get("stage_seconds") or {}
    builders = (("optimize", _optimize), ("traffic", _traffic), ("training", _training), ("canary", _canary))
    body = [
        _header(record),
        *(_section(key, build, getattr(record, key), timed.get(key)) for key, build in builders),
        _lineage(record.lineage),
    ]
    when = _text(record.meta.get("started_at"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Flywheel demo report{" · " + esc(when) if when else ""}</title>
<style>{CSS}</style></head><body>
{"".join(body)}
</body></html>
"""


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 1.5em .5em 0}
td,th{border:1px solid #ccc;padding:.25em .5em;vertical-align:top;text-align:left}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.tables{display:flex;flex-wrap:wrap;align-items:flex-start}
figure{display:inline-block;margin:.5em .5em .5em 0;vertical-align:top}img.plot{max-width:100%}
.plot-empty{display:inline-block;border:1px dashed #aaa;color:#666;padding:1em;margin:.5em;width:30em}
.not-run{color:#666;font-style:italic}.summary{font-size:1.05em;line-height:1.5}
.decision{font-weight:bold;padding:.1em .4em;border-radius:.3em;color:#fff}
.promoted{background:#2ca02c}.rolled_back{background:#d62728}.undecided{background:#7f7f7f}
code,pre{font-size:.9em}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;max-width:40em}
details{margin:.5em 0}code.params{display:block;max-width:36em;overflow-wrap:anywhere}"""


# -- small pieces --------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A value as people read it: floats to 4 significant digits, None as a dash."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value) or "none"
    return str(value)


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min ({value:.0f} s)"


def _table(rows: Iterable[tuple[str, Any]], caption: str = "") -> str:
    """A two-column table of (name, value); values already HTML when wrapped in ``_Html``."""
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}{cells}</table>"


def _grid(head: list[str], rows: Iterable[list[Any]], caption: str = "") -> str:
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{header}</tr>{body}</table>"


class _Html(str):
    """Markup built here from escaped parts: a cell shows it as is."""


def _cell(value: Any) -> str:
    return str(value) if isinstance(value, _Html) else esc(_text(value))


def _code(value: Any) -> _Html:
    return _Html(f"<code>{esc(str(value))}</code>") if value not in (None, "") else _Html("—")


def _figures(*made: Plot) -> str:
    out = []
    for p in made:
        if p.png:
            out.append(
                f'<figure><img class="plot" alt="{esc(p.title)}" title="{esc(p.title)}" '
                f'src="data:image/png;base64,{p.png}"></figure>'
            )
        else:
            out.append(f'<div class="plot-empty"><b>{esc(p.title)}</b><br>{esc(p.note)}</div>')
    return "<div>" + "".join(out) + "</div>"


def _section(key: str, build: Any, data: dict[str, Any] | None, timed: Any = None) -> str:
    title = dict(STAGES)[key]
    if not data:
        why = f": it started and stopped after {_seconds(timed)} without a result" if timed is not None else ""
        return f'<section id="{key}"><h2>{esc(title)}</h2><p class="not-run">{NOT_RUN}{esc(why)}</p></section>'
    return f'<section id="{key}"><h2>{esc(title)}</h2>{build(data)}</section>'


def _rate(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) and not isinstance(value, bool) else "—"


# -- header --------------------------------------------------------------------------------------


def summary(record: StoryRecord) -> str:
    """What the demo did, in a user's words, from the figures the record holds."""
    said: list[str] = []
    o, t, tr, c = record.optimize, record.traffic, record.training, record.canary

    def who() -> str:  # the first sentence names Flywheel, the next ones say "It"
        return "It" if said else "Flywheel"

    if o:
        said.append(
            f"{who()} searched the support assistant's config over {_text(o.get('evaluations'))} evaluations "
            f"of the test cases, with the society proposing configs (RLP) and synthesising preference "
            f"pairs (SAO); the best config scored {_text(o.get('best_score'))}."
        )
    if t:
        said.append(
            f"{who()} put the best {len(t.get('arms') or [])} configs live as arms and served "
            f"{_text(t.get('decisions'))} simulated requests; the bandit learned from "
            f"{_text(t.get('feedback_applied'))} feedback events and the trace store kept {_text(t.get('traces'))} "
            f"traces."
        )
        if isinstance(v := t.get("verdict"), dict) and v.get("p_best"):
            said.append(f"At the end, {verdict_text(v, t.get('decisions'))}.")
    if tr:
        pairs = sum(x for x in (tr.get("trace_pairs"), tr.get("sao_pairs")) if isinstance(x, int))
        said.append(
            f"{who()} trained a LoRA adapter with DPO on {pairs} preference pairs "
            f"({_text(tr.get('trace_pairs'))} from traces, {_text(tr.get('sao_pairs'))} from SAO), "
            f"registered it as policy {_text(tr.get('policy_name'))} v{_text(tr.get('version'))} and "
            f"served it as a canary arm."
        )
    if c:
        verdict = {"promoted": "promoted it", "rolled_back": "rolled it back", "undecided": "had not decided yet"}
        said.append(
            f"After {_text(c.get('decisions'))} more decisions the bandit "
            f"{verdict.get(str(c.get('decision')), _text(c.get('decision')))}, and the registry followed "
            f"(policy {_text(c.get('policy_status'))})."
        )
    return " ".join(said) or "No stage ran."


def _header(record: StoryRecord) -> str:
    meta = record.meta or {}
    rows = [
        ("commit", _code(meta.get("commit"))),
        ("command", _code(meta.get("command"))),
        ("started (UTC)", meta.get("started_at")),
        ("total time", _seconds(meta.get("seconds"))),
        ("machine", meta.get("machine")),
    ]
    models = meta.get("models")
    if isinstance(models, dict):
        rows += [(f"model: {k}", v) for k, v in models.items()]
    elif models:
        rows.append(("models", models))
    stage_rows = [[title, _stage_time(record, key)] for key, title in STAGES]
    sizes = meta.get("sizes")
    size_table = _table(sorted(sizes.items()), "sizes") if isinstance(sizes, dict) and sizes else ""
    return (
        '<header id="overview"><h1>Flywheel: the whole loop on one machine</h1>'
        f'<p class="summary">{esc(summary(record))}</p>'
        f'<div class="tables">{_table(rows, "this run")}{_grid(["stage", "time"], stage_rows, "time per stage")}'
        f"{size_table}</div></header>"
    )


def _stage_time(record: StoryRecord, key: str) -> str:
    """The stage's wall time (``meta.stage_seconds``, timed by the runner) or its own count;
    a stage that started but left no section failed."""
    timed = (record.meta.get("stage_seconds") or {}).get(key)
    section = getattr(record, key)
    if not section:
        return f"failed after {_seconds(timed)}" if timed is not None else NOT_RUN
    return _seconds(timed if timed is not None else section.get("seconds"))


# -- stages --------------------------------------------------------------------------------------


def _optimize(o: dict[str, Any]) -> str:
    rows = [
        ("run id", _code(o.get("run_id"))),
        ("state", o.get("state")),
        ("time", _seconds(o.get("seconds"))),
        ("evaluations", o.get("evaluations")),
        ("evaluations budgeted", o.get("evaluations_total")),
        ("evaluations failed", o.get("evaluations_failed")),
        ("best score", o.get("best_score")),
    ]
    best = o.get("best_config") or {}
    best_table = (
        _grid(["parameter", "value"], [[k, params_text(v)] for k, v in sorted(best.items())], "best config")
        if isinstance(best, dict) and best
        else ""
    )
    rlp = o.get("rlp") or {}
    rlp_rows = [
        ("steps", rlp.get("steps")),
        ("steps failed", rlp.get("steps_failed")),
        ("failed, by reason", rlp.get("failures") or "none"),
        ("proposals", rlp.get("proposals")),
        ("proposals resolved", rlp.get("proposals_resolved")),
        ("hit rate (beat their generation's median)", _rate(rlp.get("hit_rate"))),
        ("mean reward", rlp.get("mean_reward")),
        ("rewards by definition", rlp.get("reward_definitions") or "none"),
    ]
    sao = o.get("sao") or {}
    sao_rows = [
        ("round", _code(sao.get("round_id"))),
        ("state", sao.get("state")),
        ("pairs attempted", sao.get("attempted")),
        ("pairs kept", sao.get("pairs")),
        ("dropped, by reason", sao.get("dropped") or "none"),
        ("dataset", _code(sao.get("dataset_id"))),
        ("manifest", _code(sao.get("manifest_uri"))),
    ]
    tables = (
        _table(rows, "the run")
        + best_table
        + (_table(rlp_rows, "RLP (reasoning proposals)") if rlp else "<p>RLP: not recorded</p>")
        + (_table(sao_rows, "SAO round (synthetic pairs)") if sao else "<p>SAO: not recorded</p>")
    )
    made = (
        guard(lambda: plots.search_curve(o), "Batch search"),
        guard(lambda: plots.sao_drops(sao), "SAO round"),
    )
    return f'<div class="tables">{tables}</div>{_figures(*made)}'


def _traffic(t: dict[str, Any]) -> str:
    rows = [
        ("endpoint", _code(t.get("endpoint"))),
        ("time", _seconds(t.get("seconds"))),
        ("decisions", t.get("decisions")),
        ("feedback sent", t.get("feedback_sent")),
        ("feedback applied", t.get("feedback_applied")),
        ("traces", t.get("traces")),
        ("incumbent at the end", _code(t.get("incumbent"))),
        ("verdict", verdict_text(v, t.get("decisions")) if isinstance(v := t.get("verdict"), dict) and v else "—"),
        ("answers replayed from stage 1", t.get("answers_replayed")),
        ("answers generated live", t.get("answers_generated")),
    ]
    timeline = [p for p in t.get("timeline") or [] if isinstance(p, dict)]
    last = timeline[-1] if timeline else {}
    arm_rows = []
    for arm in t.get("arms") or []:
        if not isinstance(arm, dict):
            continue
        name = str(arm.get("arm_id"))
        post = (last.get("posterior") or {}).get(name) or {}
        interval = "—"
        a, b = post.get("alpha"), post.get("beta")
        if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0:
            lo, hi = plots.beta_interval(float(a), float(b))
            interval = f"{lo:.3f} to {hi:.3f}"
        arm_rows.append(
            [
                _code(name),
                _Html(f'<code class="params">{esc(short(params_text(arm.get("params")), 400))}</code>'),
                arm.get("batch_score"),
                arm.get("true_rate"),
                post.get("mean"),
                interval,
                ((t.get("verdict") or {}).get("p_best") or {}).get(name),
                _rate((last.get("shares") or {}).get(name)),
            ]
        )
    head = ["arm", "params", "batch score", "hidden true rate", "posterior mean", "95% interval", "P(best)"]
    head.append("last share")
    made = (
        guard(lambda: plots.traffic_shares(t), "Traffic shares"),
        guard(lambda: plots.traffic_posteriors(t), "Traffic posteriors"),
    )
    return (
        f'<div class="tables">{_table(rows, "traffic")}</div>'
        f"{_grid(head, arm_rows, 'the arms at the end of the traffic')}{_figures(*made)}"
    )


def _training(tr: dict[str, Any]) -> str:
    rows = [
        ("time", _seconds(tr.get("seconds"))),
        ("job", _code(tr.get("job_id"))),
        ("job state", tr.get("job_state")),
        ("job attempts", tr.get("job_attempts")),
        ("base model", tr.get("base_model")),
        ("policy", _code(tr.get("policy_id"))),
        ("policy name", tr.get("policy_name")),
        ("version", tr.get("version")),
        ("status when registered", tr.get("policy_status")),
        ("canary arm", _code(tr.get("arm_id"))),
        ("served model", _code(tr.get("served_model"))),
    ]
    data_rows = [
        ("pairs from traces", tr.get("trace_pairs")),
        ("pairs from SAO", tr.get("sao_pairs")),
        ("source traces", len(tr.get("source_traces") or [])),
        ("trace export", _code(tr.get("trace_dataset_id"))),
        ("trace export manifest", _code(tr.get("trace_dataset_uri"))),
        ("SAO dataset", _code(tr.get("sao_dataset_id"))),
        ("dataset rows (train + validation)", tr.get("dataset_rows")),
        ("dataset", _code(tr.get("dataset_id"))),
        ("dataset manifest", _code(tr.get("dataset_manifest_uri"))),
    ]
    steps = [s for s in tr.get("steps") or [] if isinstance(s, dict)]
    step_rows = [[s.get("step"), s.get("loss"), s.get("reward_margin"), s.get("learning_rate")] for s in steps]
    if len(step_rows) > MAX_STEP_ROWS:  # a long job: the first and last steps (the plot has them all)
        half = MAX_STEP_ROWS // 2
        step_rows = [*step_rows[:half], ["…", "", "", ""], *step_rows[-half:]]
    step_table = _grid(["step", "loss", "reward margin", "learning rate"], step_rows, "logged steps") if steps else ""
    made = (guard(lambda: plots.training_curves(tr), "DPO training"),)
    return (
        f'<div class="tables">{_table(rows, "job and policy")}{_table(data_rows, "dataset")}{step_table}</div>'
        f"{_figures(*made)}"
    )


def _canary(c: dict[str, Any]) -> str:
    decision = str(c.get("decision") or "undecided")
    timeline = [p for p in c.get("timeline") or [] if isinstance(p, dict)]
    last = timeline[-1] if timeline else {}
    rows = [
        ("decision", _Html(f'<span id="decision" class="decision {esc(decision)}">{esc(decision)}</span>')),
        ("time", _seconds(c.get("seconds"))),
        ("decisions", c.get("decisions")),
        ("of them to the canary", c.get("canary_decisions")),
        ("canary arm", _code(c.get("arm_id"))),
        ("incumbent", _code(c.get("incumbent") or (last.get("incumbent") or {}).get("arm_id"))),
        ("last P(canary better)", last.get("p_better")),
        ("last canary share", _rate(last.get("canary_share"))),
        ("promote at P ≥", c.get("promote_probability", plots.PROMOTE_PROBABILITY)),
        ("retire at P ≤", c.get("retire_probability", plots.RETIRE_PROBABILITY)),
        ("canary's hidden true rate", c.get("true_rate")),
        ("incumbent's hidden true rate", c.get("incumbent_true_rate")),
        ("arm status", c.get("arm_status")),
        ("registry: policy status", c.get("policy_status")),
    ]
    made = (guard(lambda: plots.canary_verdict(c), "Canary"),)
    return f'<div class="tables">{_table(rows, "the verdict")}{_figures(*made)}</div>'


def _lineage(lineage: list[dict[str, Any]]) -> str:
    title = "Lineage: trace to policy version"
    nodes = [n for n in lineage or [] if isinstance(n, dict)]
    if not nodes:
        return f'<section id="lineage"><h2>{esc(title)}</h2><p class="not-run">no lineage recorded</p></section>'
    rank = {k: i for i, k in enumerate(plots.LINEAGE_KINDS)}
    ordered = sorted(nodes, key=lambda n: rank.get(str(n.get("kind")), 99))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for n in ordered:
        by_kind.setdefault(str(n.get("kind")), []).append(n)
    # A kind with many nodes (the source traces, the canary's decisions) folds away under its count
    many = {k for k, ns in by_kind.items() if len(ns) > LINEAGE_FROM_SHOWN or k == "trace"}

    def parents(n: dict[str, Any]) -> _Html:
        ids = [str(_code(f)) for f in n.get("from") or []]
        more = f" and {len(ids) - LINEAGE_FROM_SHOWN} more" if len(ids) > LINEAGE_FROM_SHOWN else ""
        return _Html(", ".join(ids[:LINEAGE_FROM_SHOWN]) + more or "—")

    def rows(items: list[dict[str, Any]]) -> list[list[Any]]:
        return [[n.get("kind"), _code(n.get("id")), parents(n)] for n in items]

    table = _grid(["kind", "id", "from"], rows([n for n in ordered if str(n.get("kind")) not in many]), "the chain")
    for kind in (k for k in by_kind if k in many):
        table += (
            f"<details><summary>{esc(kind)}: {len(by_kind[kind])} nodes</summary>"
            f"{_grid(['kind', 'id', 'from'], rows(by_kind[kind]))}</details>"
        )
    made = (guard(lambda: plots.lineage_diagram(nodes), "Lineage"),)
    return f'<section id="lineage"><h2>{esc(title)}</h2>{_figures(*made)}{table}</section>'


def plot_count(record: StoryRecord) -> int:
    """How many figures a report of ``record`` holds (drawn or said empty): 2 for stage 1, 2 for
    stage 2, 1 for stage 3, 1 for stage 4 (each when the stage ran), 1 for the lineage."""
    per_stage = {"optimize": 2, "traffic": 2, "training": 1, "canary": 1}
    return sum(n for key, n in per_stage.items() if getattr(record, key)) + (1 if record.lineage else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flywheel.stack.story.report", description="Rebuild the demo's HTML report from a saved record."
    )
    parser.add_argument("record", type=Path, help="a record saved by the demo (StoryRecord.save)")
    parser.add_argument("-o", "--output", type=Path, default=Path("demo-report.html"), help="the HTML file to write")
    args = parser.parse_args(argv)
    try:
        record = StoryRecord.load(args.record)
    except (OSError, ValueError, TypeError) as exc:
        print(f"cannot read the record {args.record}: {exc}", file=sys.stderr)
        return 2
    print(write_report(record, args.output).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
