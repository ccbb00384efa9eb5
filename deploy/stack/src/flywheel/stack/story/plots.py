"""The demo report's plots: one function per figure, each taking its stage's section of the
:class:`~flywheel.stack.story.record.StoryRecord` and returning a :class:`Plot` (a base64 PNG,
or the reason there is nothing to draw).

Figures are built on ``matplotlib.figure.Figure`` directly, not pyplot: no global backend or
figure registry, so the report can be written from any thread and never opens a window.
Same look as the optimizer's run report (5.5 x 3.5 in at 100 dpi, the title on the plot)."""

from __future__ import annotations

import base64
import io
import json
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.ticker import MaxNLocator

# Fixed colours so "search" and "rlp" look the same in every report (tab10 order).
ORIGIN_COLOURS = {"search": "#1f77b4", "rlp": "#d62728", "warm_start": "#7f7f7f", "elite": "#2ca02c"}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
DECISION_COLOURS = {"promoted": "#2ca02c", "rolled_back": "#d62728", "undecided": "#7f7f7f"}
# The canary rule the story puts on its endpoint (traffic.CANARY_RULE; a test keeps them equal),
# used when the canary section does not carry its own ``promote_probability``/``retire_probability``.
PROMOTE_PROBABILITY = 0.9
RETIRE_PROBABILITY = 0.1
# The lineage diagram shows at most this many nodes of one kind on a level, then "+N more".
LINEAGE_SHOWN = 3


@dataclass(frozen=True)
class Plot:
    """One figure of the report: ``png`` is base64 PNG, or ``None`` with ``note`` saying why."""

    title: str
    png: str | None
    note: str = ""


def empty(title: str, note: str) -> Plot:
    return Plot(title, None, note)


def _emit(title: str, fig: Figure, tight: bool = True) -> Plot:
    buf = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    return Plot(title, base64.b64encode(buf.getvalue()).decode())


def _figure(width: float = 5.5, height: float = 3.5, rows: int = 1, cols: int = 1, **kw: Any) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def _title(ax: Any, text: str, width: int = 60) -> None:
    ax.set_title("\n".join(textwrap.wrap(text, width)), fontsize=10)


def _number(value: Any) -> float | None:
    """A finite float, or None (missing values and NaN are not plotted)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def short(text: Any, width: int = 22) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _colours(names: Sequence[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def guard(build: Callable[[], Plot], title: str) -> Plot:
    """``build()``, or an empty plot naming the error: a malformed section costs its figure,
    not the whole report (the tables beside it still show the figures)."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - any bad value in a record: say so in the page
        return empty(title, f"could not draw: {type(exc).__name__}: {exc}")


# -- stage 1: batch optimization -----------------------------------------------------------------


def search_curve(optimize: dict[str, Any]) -> Plot:
    """Each evaluated candidate's mean score (coloured by origin: the search or an RLP proposal)
    at the evaluation count it was finished at, and the best so far (a step line)."""
    title = "Batch search: each candidate's mean score and the best so far"
    points = [
        (int(p["evaluation"]), _number(p.get("score")), _number(p.get("best")), str(p.get("origin") or "search"))
        for p in optimize.get("curve") or []
        if isinstance(p, dict) and _number(p.get("evaluation")) is not None
    ]
    if not points:
        return empty(title, "no evaluation was recorded")
    fig, axes = _figure(5.8, 3.6)
    ax = axes[0][0]
    origins = sorted({o for *_, o in points}, key=lambda o: (o not in ORIGIN_COLOURS, o))
    extra = iter(PALETTE[4:])
    for origin in origins:
        mine = [(e, s) for e, s, _, o in points if o == origin and s is not None]
        colour = ORIGIN_COLOURS.get(origin) or next(extra, "#333333")
        ax.scatter([e for e, _ in mine], [s for _, s in mine], s=24, alpha=0.75, color=colour, label=origin)
    best = [(e, b) for e, _, b, _ in points if b is not None]
    if best:
        ax.step([e for e, _ in best], [b for _, b in best], where="post", color="black", lw=1.6, label="best so far")
    ax.set_xlabel("test-case evaluations so far")
    ax.set_ylabel("score")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="lower right", fontsize=8, title="candidate origin", title_fontsize=8)
    _title(ax, title)
    return _emit(title, fig)


def sao_drops(sao: dict[str, Any] | None) -> Plot:
    """The SAO round's pairs: kept, and dropped by reason."""
    title = "SAO round: pairs kept and dropped by reason"
    if not sao:
        return empty(title, "no SAO round was recorded")
    dropped = {str(k): int(v) for k, v in (sao.get("dropped") or {}).items() if _number(v)}
    kept = int(_number(sao.get("pairs")) or 0)
    if not kept and not dropped:
        return empty(title, "the round attempted no pairs")
    labels = ["kept", *sorted(dropped, key=lambda k: -dropped[k])]
    values = [kept, *(dropped[k] for k in labels[1:])]
    fig, axes = _figure(5.4, max(2.6, 1.1 + 0.38 * len(labels)))
    ax = axes[0][0]
    colours = ["#2ca02c", *["#d62728"] * len(dropped)]
    ax.barh(range(len(labels)), values, color=colours)
    ax.set_yticks(range(len(labels)), [("dropped: " if i else "") + short(k, 28) for i, k in enumerate(labels)])
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v}", va="center", fontsize=8)
    ax.set_xlabel("pairs")
    ax.set_ylabel("outcome")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, max(values) * 1.15 + 0.5)
    _title(ax, title, 34)  # long reason labels leave the axes narrow
    return _emit(title, fig)


# -- stage 2: traffic ----------------------------------------------------------------------------


def arm_names(traffic: dict[str, Any]) -> list[str]:
    """Arms in the record's order, then any the timeline names that the arm list lacks."""
    names = [str(a["arm_id"]) for a in traffic.get("arms") or [] if isinstance(a, dict) and "arm_id" in a]
    for point in traffic.get("timeline") or []:
        for key in ("shares", "posterior"):
            for arm in (point.get(key) or {}) if isinstance(point, dict) else {}:
                if arm not in names:
                    names.append(str(arm))
    return names


def traffic_shares(traffic: dict[str, Any]) -> Plot:
    """Each arm's share of the decisions, window by window (stacked)."""
    title = "Traffic: share of decisions per arm over time"
    timeline = [p for p in traffic.get("timeline") or [] if isinstance(p, dict) and p.get("shares")]
    if not timeline:
        return empty(title, "no traffic timeline was recorded")
    names = arm_names(traffic)
    colours = _colours(names)
    xs = [int(p["decision"]) for p in timeline]
    ys = [[_number(p["shares"].get(n)) or 0.0 for p in timeline] for n in names]
    fig, axes = _figure(5.5, 3.6)
    ax = axes[0][0]
    ax.stackplot(xs, ys, labels=[short(n) for n in names], colors=[colours[n] for n in names], alpha=0.85)
    ax.set_xlim(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("decision")
    ax.set_ylabel("share of the last window")
    ax.legend(loc="upper left", fontsize=7, framealpha=0.8)
    _title(ax, title)
    return _emit(title, fig)


def beta_interval(alpha: float, beta: float, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` interval of Beta(alpha, beta) (a seeded Monte Carlo estimate:
    numpy alone, no scipy in this package; 20,000 draws put the ends within ~0.005)."""
    import numpy as np

    draws = np.random.default_rng(0).beta(alpha, beta, 20_000)
    lo, hi = np.quantile(draws, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def posterior_track(timeline: list[dict[str, Any]], arm: str) -> list[tuple[int, float, float, float]]:
    """(decision, mean, 2.5 %, 97.5 %) of ``arm``'s Beta posterior at each timeline point."""
    out = []
    for p in timeline:
        post = (p.get("posterior") or {}).get(arm)
        if not isinstance(post, dict):
            continue
        a, b = _number(post.get("alpha")), _number(post.get("beta"))
        if a is None or b is None or a <= 0 or b <= 0:
            continue
        mean = _number(post.get("mean"))
        lo, hi = beta_interval(a, b)
        out.append((int(p["decision"]), mean if mean is not None else a / (a + b), lo, hi))
    return out


def traffic_posteriors(traffic: dict[str, Any]) -> Plot:
    """Each arm's posterior mean with its 95 % interval, and its hidden true rate dashed."""
    title = "Traffic: posterior mean and 95% interval per arm (dashed: hidden true rate)"
    timeline = [p for p in traffic.get("timeline") or [] if isinstance(p, dict) and p.get("posterior")]
    if not timeline:
        return empty(title, "no posterior was recorded")
    names = arm_names(traffic)
    colours = _colours(names)
    truth = {str(a.get("arm_id")): _number(a.get("true_rate")) for a in traffic.get("arms") or []}
    fig, axes = _figure(5.5, 3.6)
    ax = axes[0][0]
    for n in names:
        track = posterior_track(timeline, n)
        if not track:
            continue
        xs = [t[0] for t in track]
        ax.plot(xs, [t[1] for t in track], color=colours[n], lw=1.6, label=short(n))
        ax.fill_between(xs, [t[2] for t in track], [t[3] for t in track], color=colours[n], alpha=0.18)
        if truth.get(n) is not None:
            ax.axhline(truth[n], color=colours[n], ls="--", lw=1.1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("decision")
    ax.set_ylabel("success rate (posterior)")
    ax.legend(loc="lower right", fontsize=7, framealpha=0.8)
    _title(ax, title, 48)
    return _emit(title, fig)


# -- stage 3: training ---------------------------------------------------------------------------


def training_curves(training: dict[str, Any]) -> Plot:
    """DPO loss and reward margin per optimizer step, side by side."""
    title = "DPO training: loss and reward margin per step"
    steps = [s for s in training.get("steps") or [] if isinstance(s, dict) and _number(s.get("step")) is not None]
    if not steps:
        return empty(title, "the job logged no training step")
    fig, axes = _figure(8.5, 3.3, 1, 2)
    for ax, key, label, colour in (
        (axes[0][0], "loss", "DPO loss", "#1f77b4"),
        (axes[0][1], "reward_margin", "reward margin (chosen - rejected)", "#ff7f0e"),
    ):
        pts = [(int(s["step"]), _number(s.get(key))) for s in steps]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=colour)
        else:
            ax.text(0.5, 0.5, f"no {key} logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _title(ax, f"{label} per step", 40)
    return _emit(title, fig)


# -- stage 4: canary -----------------------------------------------------------------------------


def canary_verdict(canary: dict[str, Any]) -> Plot:
    """P(canary better than the incumbent) against the promote/retire thresholds, and the
    canary's share of the traffic, over the canary's decisions."""
    title = "Canary: P(canary better) and its share of traffic"
    timeline = [
        p for p in canary.get("timeline") or [] if isinstance(p, dict) and _number(p.get("decision")) is not None
    ]
    if not timeline:
        return empty(title, "no canary timeline was recorded")
    promote = _number(canary.get("promote_probability")) or PROMOTE_PROBABILITY
    retire = _number(canary.get("retire_probability")) or RETIRE_PROBABILITY
    decision = str(canary.get("decision") or "undecided")
    fig, axes = _figure(6.5, 4.6, 2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top, bottom = axes[0][0], axes[1][0]
    xs = [int(p["decision"]) for p in timeline]
    pb = [_number(p.get("p_better")) for p in timeline]
    top.plot(
        [x for x, y in zip(xs, pb, strict=True) if y is not None], [y for y in pb if y is not None], color="#9467bd"
    )
    top.axhline(promote, color=DECISION_COLOURS["promoted"], ls="--", lw=1, label=f"promote at {promote:g}")
    top.axhline(retire, color=DECISION_COLOURS["rolled_back"], ls="--", lw=1, label=f"retire at {retire:g}")
    top.axvline(xs[-1], color=DECISION_COLOURS.get(decision, "#7f7f7f"), lw=1.2, ls=":")
    top.text(xs[-1], 0.5, f" {decision} ", rotation=90, va="center", ha="right", fontsize=8,
             color=DECISION_COLOURS.get(decision, "#7f7f7f"))  # fmt: skip
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("P(canary better)")
    top.legend(loc="best", fontsize=7, framealpha=0.8)
    _title(top, f"{title} (decision: {decision})", 70)
    share = [(x, _number(p.get("canary_share"))) for x, p in zip(xs, timeline, strict=True)]
    share = [(x, y) for x, y in share if y is not None]
    bottom.plot([x for x, _ in share], [y for _, y in share], color="#8c564b")
    bottom.set_ylim(0, 1)
    bottom.set_xlabel("decision (since the canary arm was added)")
    bottom.set_ylabel("canary share")
    _title(bottom, "Canary's share of the last window", 70)
    return _emit(title, fig)


# -- lineage -------------------------------------------------------------------------------------

LINEAGE_KINDS = ("trace", "trace_dataset", "sao_dataset", "dataset", "job", "policy", "arm", "decision")


def lineage_levels(lineage: list[dict[str, Any]]) -> dict[str, int]:
    """Each node's level: 0 for a node with no known parent, else 1 + its deepest parent's
    (a cycle or an unknown parent does not loop or fail; it just starts a level)."""
    parents = {str(n["id"]): [str(p) for p in n.get("from") or []] for n in lineage if "id" in n}
    levels: dict[str, int] = {}

    def level(node: str, seen: frozenset[str]) -> int:
        if node in levels:
            return levels[node]
        known = [p for p in parents.get(node, []) if p in parents and p not in seen]
        levels[node] = 1 + max((level(p, seen | {node}) for p in known), default=-1)
        return levels[node]

    for node in parents:
        level(node, frozenset())
    return levels


def lineage_diagram(lineage: list[dict[str, Any]]) -> Plot:
    """Boxes (kind and id) on levels from traces down to decisions, arrows for "from"; a kind
    with many nodes on one level shows the first few and a "+N more" box."""
    title = "Lineage: from traces to the served policy and its decisions"
    nodes = [n for n in lineage if isinstance(n, dict) and "id" in n]
    if not nodes:
        return empty(title, "no lineage was recorded")
    levels = lineage_levels(nodes)
    kind_of = {str(n["id"]): str(n.get("kind") or "?") for n in nodes}
    rank = {k: i for i, k in enumerate(LINEAGE_KINDS)}
    # Which box each node is drawn in: itself, or its level's "+N more <kind>" box.
    boxes: dict[int, list[tuple[str, str, str]]] = {}  # level -> [(box key, kind, label)]
    box_of: dict[str, str] = {}
    groups: dict[tuple[int, str], list[str]] = {}
    for n in nodes:
        groups.setdefault((levels[str(n["id"])], kind_of[str(n["id"])]), []).append(str(n["id"]))
    for (lvl, kind), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], rank.get(kv[0][1], 99), kv[0][1])):
        row = boxes.setdefault(lvl, [])
        for i in ids[:LINEAGE_SHOWN]:
            row.append((i, kind, short(i, 24)))
            box_of[i] = i
        if len(ids) > LINEAGE_SHOWN:
            key = f"more:{lvl}:{kind}"
            row.append((key, kind, f"+{len(ids) - LINEAGE_SHOWN} more"))
            for i in ids[LINEAGE_SHOWN:]:
                box_of[i] = key
    depth = max(boxes) + 1
    widest = max(len(r) for r in boxes.values())
    fig = Figure(figsize=(max(7.5, 2.0 * widest), 0.95 * depth + 0.7))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.9 - 0.1 / depth))
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.4, depth - 0.6)
    ax.invert_yaxis()
    ax.axis("off")
    fig.suptitle(title, fontsize=10)
    centre: dict[str, tuple[float, float]] = {}
    width = min(0.9 / widest, 0.3)
    kinds = sorted({k for r in boxes.values() for _, k, _ in r}, key=lambda k: (rank.get(k, 99), k))
    colours = _colours(kinds)
    for lvl, row in boxes.items():
        for j, (key, kind, label) in enumerate(row):
            x = (j + 0.5) / len(row)
            centre[key] = (x, lvl)
            ax.add_patch(
                FancyBboxPatch(
                    (x - width / 2, lvl - 0.28),
                    width,
                    0.56,
                    boxstyle="round,pad=0.005,rounding_size=0.02",
                    facecolor=colours[kind] + "33",
                    edgecolor=colours[kind],
                )
            )
            ax.text(x, lvl - 0.08, kind, ha="center", va="center", fontsize=8, weight="bold")
            ax.text(x, lvl + 0.14, label, ha="center", va="center", fontsize=7, family="monospace")
    edges = set()
    for n in nodes:
        child = box_of[str(n["id"])]
        for p in n.get("from") or []:
            if str(p) in box_of and box_of[str(p)] != child:
                edges.add((box_of[str(p)], child))
    for parent, child in sorted(edges):
        (x0, y0), (x1, y1) = centre[parent], centre[child]
        if y1 == y0:
            continue
        ax.add_patch(
            FancyArrowPatch(
                (x0, y0 + 0.3), (x1, y1 - 0.3), arrowstyle="-|>", mutation_scale=10, color="#555555", lw=0.8
            )
        )
    return _emit(title, fig, tight=False)  # placed by hand: tight_layout cannot fit an axes-less diagram


def params_text(params: Any) -> str:
    return json.dumps(params, sort_keys=True, default=str) if isinstance(params, dict | list) else str(params)
