"""Print the Markdown figures of a bench/llm-config results JSON (as pasted in README.md).

python bench/llm-config/figures.py bench/results/llm-config.json
"""

import json
import sys

d = json.load(open(sys.argv[1]))  # noqa: SIM115
f, r = d["figures"], d["ratios"]
st = d["stamp"]
n = len(d["params"]["seeds"])
print(
    f"Command `{st['command']}`, commit `{st['commit'][:7]}` (dirty: {st['dirty']}), {st['date']}, "
    f"{d['machine']['cpu']} x{d['machine']['cores']} (load at start {d['machine']['load_at_start']}), "
    f"{f['seconds']} s; seeds {d['params']['seeds'][0]}-{d['params']['seeds'][-1]}; "
    f"runs reused: {d['params'].get('runs_reused', 0)}.\n"
)
print("Mean evaluations to target (reached / seeds):\n")
M = ("flywheel", "flywheel_no_racing", "optuna_tpe_wilcoxon", "optuna_tpe", "random")
print("| table | " + " | ".join(M) + " | TPE+Wilcoxon / Flywheel [95% CI] | TPE / Flywheel [95% CI] |")
print("|---" * (len(M) + 3) + "|")
for name, t in f["tables"].items():
    cells = [f"{t[m]['mean_evaluations_to_target']:.0f} ({t[m]['reached']}/{n})" for m in M]
    w = t["ratios"]["optuna_tpe_wilcoxon_vs_flywheel"]
    p = t["ratios"]["optuna_tpe_vs_flywheel"]
    label = name + ("" if t["table"]["held_out"] else " (tuning)")
    print(
        f"| {label} | "
        + " | ".join(cells)
        + f" | {w['ratio']:.2f} [{w['ci95'][0]:.2f}, {w['ci95'][1]:.2f}]"
        + f" | {p['ratio']:.2f} [{p['ci95'][0]:.2f}, {p['ci95'][1]:.2f}] |"
    )
print("\n| held-out ratio | value | 95% CI | goal | met |\n|---|---|---|---|---|")
for k, v in r.items():
    if isinstance(v, list) or k.endswith("ci_low"):
        continue
    ci = r.get(k + "_ci95")
    g = d["goals"].get(k)
    met = "" if g is None else ("yes" if v >= g else "**NO**")
    print(f"| `{k}` | {v:.2f} | [{ci[0]:.2f}, {ci[1]:.2f}] | {'' if g is None else f'>= {g}'} | {met} |")
k = "heldout_tpe_wilcoxon_vs_flywheel_ci_low"
if k in r:
    print(f"| `{k}` | {r[k]:.2f} | | >= 1.0 | {'yes' if r[k] >= 1 else '**NO**'} |")
