"""A scripted reasoning model: an honest stand-in for an LLM in the RLP step.

It reads ONLY the chat messages that ``flywheel.society.rlp.thoughts.build_prompt`` writes (the
search space as JSON, the shown history lines ``- {params} -> score x``, and "Write G different
thoughts ... propose M configs") and answers the JSON the prompt asks for. It never sees the
benchmark's table, the true scores, the hidden test cases or the run's internals. Deterministic:
the same prompt gives the same answer.

Each thought is one hypothesis about the shown results, with the configs it implies and a
predicted score (and sigma) computed from that hypothesis alone:

- ``marginal``: parameters act additively. Per-value mean score of each parameter over the
  shown history, shrunk towards the overall mean (2 pseudo-observations); propose the config
  of the best value of every parameter, then the runner-up value on the parameter whose top
  two values are closest. Prediction: overall mean + the sum of the chosen values' effects.
- ``local``: the best shown config is near the optimum; propose its neighbours one grid step
  away on the numeric parameters (the side whose value scored better in the marginals first).
  Prediction: the mean of the best three shown scores (a shown best is inflated by noise).
- ``interaction``: what works depends on the categorical choice of the best config. Marginals
  computed only over shown configs sharing the best config's first categorical parameter
  (then its first two), combined as in ``marginal``.
- ``explore``: a combination of categorical values never shown, the one the additive model
  rates highest, other parameters from ``marginal``; predicted halfway between the overall mean
  and the additive model (the combination's interaction is unknown) but no higher than the
  median shown score (the prompt shows only the best results), with a wider sigma.

With G > 4 the hypotheses repeat with the next-ranked alternatives; proposals already shown in
the history are skipped (the model cannot know about configs the prompt does not show). Every
stated sigma is at least the residual spread of the additive model over the shown results (a
prediction is no surer than the model that made it)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

HYPOTHESES = ("marginal", "local", "interaction", "explore")
SHRINK = 2.0  # pseudo-observations at the overall mean for each per-value mean

_HISTORY = re.compile(r"^- (\{.*\}) -> \S+ (-?[0-9.eE+-]+|None)\s*$")
_ASK = re.compile(r"Write (\d+) different thoughts\. After each, propose (\d+) configs")


class PromptError(ValueError):
    """The prompt lacks what the scripted model reads (space, history lines, the request)."""


def read_prompt(messages: Sequence[Mapping[str, str]]) -> tuple[dict[str, Any], list[tuple[dict, float]], int, int]:
    """(search space, shown history as (params, score), G, proposals per thought) from the text."""
    text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    lines = text.splitlines()
    try:
        space = json.loads(lines[lines.index("Search space:") + 1])
    except (ValueError, IndexError) as exc:
        raise PromptError(f"no search space line in the prompt ({exc})") from exc
    history = []
    for line in lines:
        m = _HISTORY.match(line)
        if m and m.group(2) != "None":
            history.append((json.loads(m.group(1)), float(m.group(2))))
    ask = _ASK.search(text)
    if ask is None:
        raise PromptError("the prompt does not say how many thoughts and configs to write")
    return space, history, int(ask.group(1)), int(ask.group(2))


class ScriptedReasoner:
    """``complete(messages) -> str``: the JSON thoughts answer for a build_prompt prompt.

    ``calibrate``: learn from the few-shot examples the prompt shows (the society's
    best-rewarded earlier thoughts with what happened, ``build_context``'s "Example i. Earlier
    thought: ... What happened: ..." blocks): per kind of hypothesis, the error of the
    hypothesis's own prediction (stated in each thought) against the observed scores shifts
    that kind's next predictions (shrunk: one pseudo-error of 0) and widens its sigma to the
    errors' root mean square. ``imitate``: write only the kinds of thought the examples show,
    best first (the earlier policy)."""

    name = "scripted"

    def __init__(self, *, calibrate: bool = False, imitate: bool = False) -> None:
        self.calibrate, self.imitate = calibrate, imitate

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str:
        space, history, g, m = read_prompt(messages)
        if not history:
            return "I need results before I can reason about them."  # prose: the step fails, as an LLM's would
        params = _params(space)
        shown = {_key(p) for p, _ in history}
        examples = read_examples(messages)
        kinds = (self.imitate and _kinds_of(examples)) or list(HYPOTHESES)
        errors = _errors_by_kind(examples) if self.calibrate else {}
        spread = _Additive(params, history).residual_sd(history)
        thoughts = []
        for i in range(g):
            kind, rank = kinds[i % len(kinds)], i // len(kinds)
            text, proposals = getattr(self, f"_{kind}")(params, history, shown, m, rank)
            if not proposals:
                continue
            said = sum(p["predicted_score"] for p in proposals) / len(proposals)
            errs = errors.get(kind, [])
            shift = sum(errs) / (len(errs) + 1)
            rms = (sum(e * e for e in errs) / len(errs)) ** 0.5 if errs else 0.0
            for p in proposals:  # no prediction is surer than the additive fit's residual spread
                p["predicted_score"] = round(min(1.0, max(0.0, p["predicted_score"] + shift)), 3)
                p["sigma"] = round(max(p["sigma"], spread, rms), 3)
            text += f" The hypothesis says {said:.3f}"
            text += f"; its earlier errors shift that to {said + shift:.3f}." if errs else "."
            thoughts.append({"thought": text, "proposals": proposals})
        return json.dumps({"thoughts": thoughts})

    # --- hypotheses ---------------------------------------------------------------------------

    def _marginal(self, params, history, shown, m, rank):
        model = _Additive(params, history)
        configs = model.ranked_configs(limit=m + rank + 8)
        out = _fresh(configs, shown, m, skip=rank)
        return (
            "Assume the parameters act independently: take, for each one, the value whose shown "
            f"results average best ({_describe(model.best_values())}).",
            [_proposal(c, model.predict(c), 0.08) for c in out],
        )

    def _local(self, params, history, shown, m, rank):
        ordered = sorted(history, key=lambda h: -h[1])
        best, _ = ordered[min(rank, len(ordered) - 1)]
        top = [s for _, s in ordered[:3]]
        model = _Additive(params, history)
        neighbours = []
        for name, spec in params.items():
            grid = spec["grid"]
            if spec["kind"] == "categorical" or name not in best or best[name] not in grid:
                continue
            j = grid.index(best[name])
            steps = [grid[j + d] for d in (-1, 1) if 0 <= j + d < len(grid)]
            steps.sort(key=lambda v: -model.effect(name, v))
            neighbours += [{**best, name: v} for v in steps]
        neighbours.sort(key=lambda c: -model.predict(c))
        out = _fresh(neighbours, shown, m)
        pred = sum(top) / len(top)
        return (
            f"The best result so far ({_describe(best)}) sits near the optimum; its neighbours one "
            "step away should score about as well as the best few results.",
            [_proposal(c, pred, 0.06) for c in out],
        )

    def _interaction(self, params, history, shown, m, rank):
        best = max(history, key=lambda h: h[1])[0]
        cats = [n for n, s in params.items() if s["kind"] == "categorical" and n in best]
        configs, why = [], []
        for depth in (1, 2):
            fixed = {n: best[n] for n in cats[:depth]}
            subset = [(p, s) for p, s in history if all(p.get(n) == v for n, v in fixed.items())]
            if len(subset) < 2:
                continue
            model = _Additive(params, subset, fixed=fixed)
            for c in model.ranked_configs(limit=m + rank + 4):
                configs.append((c, model.predict(c)))
            why.append(_describe(fixed))
        out = _fresh([c for c, _ in configs], shown, m, skip=rank)
        preds = {_key(c): p for c, p in configs}
        return (
            "What works depends on the categorical choice: among results sharing "
            f"{' / '.join(why) or 'the best config'}, the other parameters' best values differ from the overall ones.",
            [_proposal(c, preds[_key(c)], 0.07) for c in out],
        )

    def _explore(self, params, history, shown, m, rank):
        model = _Additive(params, history)
        cats = [n for n, s in params.items() if s["kind"] == "categorical"]
        seen_combos = {tuple(p.get(n) for n in cats) for p, _ in history}
        base = model.best_config()
        combos = [combo for combo in _product([params[n]["grid"] for n in cats]) if tuple(combo) not in seen_combos]
        configs = [{**base, **dict(zip(cats, combo, strict=True))} for combo in combos]
        configs.sort(key=lambda c: -model.predict(c))
        out = _fresh(configs, shown, m, skip=rank)
        return (
            "Some combinations of the categorical choices were never tried; the additive model "
            "rates these untried ones highest, and trying them tells us whether it is right.",
            [_proposal(c, model.untried(c), 0.12) for c in out],
        )


OPENINGS = {  # how each hypothesis's thought begins: the model recognises its own earlier thoughts
    "marginal": "Assume the parameters act independently",
    "local": "The best result so far",
    "interaction": "What works depends on the categorical choice",
    "explore": "Some combinations of the categorical choices",
}
_EXAMPLE = re.compile(r"^Example \d+\. Earlier thought: (.*)$")
_HAPPENED = re.compile(r"^What happened: (.*)$")
_SAID = re.compile(r"The hypothesis says (-?[0-9.]+)")
_OBSERVED = re.compile(r": score (-?[0-9.]+)")


def read_examples(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, float | None, list[float]]]:
    """The few-shot examples in the prompt, best-rewarded first: (kind of thought or "", the
    prediction its hypothesis stated or None, the observed scores shown)."""
    text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    out: list[tuple[str, float | None, list[float]]] = []
    thought = None
    for line in text.splitlines():
        if m := _EXAMPLE.match(line.strip()):
            thought = m.group(1)
        elif (m := _HAPPENED.match(line.strip())) and thought is not None:
            kind = next((k for k, opening in OPENINGS.items() if thought.startswith(opening)), "")
            said = _SAID.search(thought)
            observed = [float(x) for x in _OBSERVED.findall(m.group(1))]
            out.append((kind, float(said.group(1).rstrip(".")) if said else None, observed))
            thought = None
    return out


def _kinds_of(examples: list[tuple[str, float | None, list[float]]]) -> list[str]:
    kinds: list[str] = []
    for kind, _, _ in examples:
        if kind and kind not in kinds:
            kinds.append(kind)
    return kinds


def _errors_by_kind(examples: list[tuple[str, float | None, list[float]]]) -> dict[str, list[float]]:
    """Observed mean minus the hypothesis's own prediction, per kind of thought."""
    out: dict[str, list[float]] = defaultdict(list)
    for kind, said, observed in examples:
        if kind and said is not None and observed:
            out[kind].append(sum(observed) / len(observed) - said)
    return out


class _Additive:
    """Shrunk per-value mean scores over a set of shown results; ``fixed`` values are kept."""

    def __init__(self, params: dict[str, dict], history: list[tuple[dict, float]], fixed: dict | None = None) -> None:
        self.params, self.fixed = params, fixed or {}
        self.mean = sum(s for _, s in history) / len(history)
        ordered = sorted(s for _, s in history)
        self.median = ordered[len(ordered) // 2]
        sums: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        for p, s in history:
            for name in params:
                if name in p:
                    sums[name][_hashable(p[name])].append(s)
        self.effects = {
            name: {v: (sum(sc) + SHRINK * self.mean) / (len(sc) + SHRINK) - self.mean for v, sc in sums[name].items()}
            for name in params
        }

    def effect(self, name: str, value: Any) -> float:
        return self.effects.get(name, {}).get(_hashable(value), 0.0)

    def predict(self, config: Mapping[str, Any]) -> float:
        q = self.mean + sum(self.effect(n, config.get(n)) for n in self.params if n not in self.fixed)
        return round(min(1.0, max(0.0, q)), 3)

    def residual_sd(self, history: list[tuple[dict, float]]) -> float:
        """How far the shown scores fall from this model's predictions: the honest spread."""
        errors = [(s - self.predict(p)) ** 2 for p, s in history]
        return (sum(errors) / len(errors)) ** 0.5

    def untried(self, config: Mapping[str, Any]) -> float:
        """For a combination never seen together: half the additive effect (the interaction is
        unknown), and no more than the median shown score (the shown results are the best ones)."""
        return round(min(self.mean + 0.5 * (self.predict(config) - self.mean), self.median), 3)

    def ranked_values(self, name: str) -> list[Any]:
        if name in self.fixed:
            return [self.fixed[name]]
        tried = [v for v in self.params[name]["grid"] if _hashable(v) in self.effects[name]]
        return sorted(tried or self.params[name]["grid"], key=lambda v: -self.effect(name, v))

    def best_values(self) -> dict[str, Any]:
        return {n: self.ranked_values(n)[0] for n in self.params}

    def best_config(self) -> dict[str, Any]:
        return self.best_values()

    def ranked_configs(self, limit: int) -> list[dict[str, Any]]:
        """The best config, then single swaps to a runner-up value, the closest gap first."""
        best = self.best_config()
        out = [best]
        swaps = []
        for name in self.params:
            ranked = self.ranked_values(name)
            for v in ranked[1:3]:
                swaps.append((self.effect(name, ranked[0]) - self.effect(name, v), {**best, name: v}))
        swaps.sort(key=lambda t: t[0])
        out += [c for _, c in swaps]
        return out[:limit]


def _params(space: Mapping[str, Any]) -> dict[str, dict]:
    """Each parameter's kind and its grid of values (continuous: its step grid, else 11 points)."""
    params = space.get("parameters", space)
    out = {}
    for name, spec in params.items():
        if isinstance(spec, list):
            spec = {"type": "categorical", "values": spec}
        kind = str(spec.get("type", "categorical" if "values" in spec else "continuous")).lower()
        if kind in ("categorical", "choice", "bool", "boolean", "discrete"):
            values = list(spec.get("values") or spec.get("choices") or [True, False])
            out[name] = {"kind": "categorical" if kind != "discrete" else "discrete", "grid": values}
        else:
            lo, hi = float(spec["min"]), float(spec["max"])
            step = float(spec.get("step") or (hi - lo) / 10)
            n = round((hi - lo) / step)
            out[name] = {"kind": "continuous", "grid": [round(lo + i * step, 10) for i in range(n + 1)]}
    return out


def _fresh(configs: list[dict], shown: set[str], m: int, skip: int = 0) -> list[dict]:
    out, keys = [], set()
    for c in configs:
        k = _key(c)
        if k in shown or k in keys:
            continue
        keys.add(k)
        out.append(c)
    return out[skip : skip + m] or out[:m]


def _proposal(config: dict, predicted: float, sigma: float) -> dict[str, Any]:
    return {"params": config, "predicted_score": predicted, "sigma": sigma}


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps({k: _hashable(v) for k, v in params.items()}, sort_keys=True)


def _hashable(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return round(v, 10) if isinstance(v, float) else v


def _describe(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def _product(grids: list[list[Any]]) -> list[list[Any]]:
    out: list[list[Any]] = [[]]
    for grid in grids:
        out = [[*o, v] for o in out for v in grid]
    return out
