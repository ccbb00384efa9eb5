"""What the traffic stage showed about its arms, told plainly: which arm the bandit favours,
how sure it is, and whether that is the arm whose hidden true rate is highest. Arms a few
points apart are often not told apart by a few hundred decisions; the story says so rather
than crowning its favourite."""

from __future__ import annotations

from typing import Any

TOLD_APART = 0.95  # P(best) at which the favourite counts as told apart from the others


def verdict(arms: list[dict[str, Any]], post: dict[str, dict[str, float]], *, draws: int = 20_000) -> dict[str, Any]:
    """What the traffic showed about the arms: each arm's probability of being the best under
    the endpoint's final Beta posteriors (a seeded Monte Carlo estimate), the bandit's
    favourite (the most probable best), the hidden best (highest hidden true rate), and
    whether the favourite is told apart (P(best) >= TOLD_APART). With arms a few points
    apart, a few hundred decisions often cannot separate them: said, not hidden."""
    import numpy as np

    names = [a["arm_id"] for a in arms if a["arm_id"] in post]
    if not names:
        return {}
    rng = np.random.default_rng(0)
    samples = np.stack([rng.beta(post[n]["alpha"], post[n]["beta"], draws) for n in names])
    wins = np.bincount(samples.argmax(axis=0), minlength=len(names)) / draws
    p_best = {n: round(float(w), 3) for n, w in zip(names, wins, strict=True)}
    favourite = max(names, key=lambda n: p_best[n])
    rates = {a["arm_id"]: a.get("true_rate") for a in arms if isinstance(a.get("true_rate"), int | float)}
    hidden_best = max(rates, key=lambda n: rates[n]) if rates else None
    return {
        "p_best": p_best,
        "favourite": favourite,
        "told_apart": p_best[favourite] >= TOLD_APART,
        "hidden_best": hidden_best,
        "favourite_true_rate": rates.get(favourite),
        "best_true_rate": rates.get(hidden_best) if hidden_best else None,
    }


def verdict_text(v: dict[str, Any], decisions: int) -> str:
    """``verdict`` in one sentence for the report and the demo's summary line."""
    if not v:
        return "no arm had a posterior"
    fav, best, p = v["favourite"], v.get("hidden_best"), v["p_best"][v["favourite"]]
    sure = "told apart" if v["told_apart"] else f"not yet told apart (below {TOLD_APART:.2f})"
    if best is None:
        return f"the bandit favours {fav} (P(best) {p:.2f}, {sure}); no hidden rate was measured"
    if fav == best:
        return f"the bandit favours {fav}, the hidden best (P(best) {p:.2f}, {sure})"
    rates = f"hidden rates {v['favourite_true_rate']:.2f} vs {v['best_true_rate']:.2f}"
    if v["told_apart"]:
        return f"the bandit is confident in {fav} (P(best) {p:.2f}) but the hidden best is {best} ({rates}): a miss"
    return (
        f"the bandit favours {fav} (P(best) {p:.2f}), not the hidden best {best} ({rates}): "
        f"{decisions} decisions have not told these arms apart yet"
    )
