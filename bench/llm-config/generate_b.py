"""A second llm-config world with a different structure from generate.py's: every effect is drawn
from the table's seed (nothing hand-placed), 40 test cases, heteroscedastic and partly binary
noise, a three-way interaction, and a categorical parameter with a plateau. Written before any
method was run on it and not changed after (bench/llm-config/README.md says which seeds are
scored); ``build(seed)`` returns the table in memory.

    python bench/llm-config/generate_b.py [--seed 7201]   # prints the table's summary

The model, for config c and test case j (scores in [0, 1]):

    logit[c, j] = q[c] - d[j] + h[type(j), model(c)] + s[j] * e[c, j]

- q[c] = base[model] + plateau[system_prompt]
         - curv[model] * (temperature - t_best[model])^2
         + shot[model] * log1p(few_shot) / log(9) + shot_prompt[system_prompt] * (few_shot > 0)
         + w3[model] * (temperature - 0.6) * log2(max_tokens / 512) / 2     (three-way)
         - 0.8 * [max_tokens == 128] * long[model]                           (truncation)
  with base ~ N(0, 0.5), t_best ~ U(0, 1.1), curv ~ U(1, 4), shot ~ N(0.15, 0.2),
  shot_prompt ~ N(0, 0.25), w3 ~ N(0, 0.8), long ~ U(0, 1) per level;
  ``plateau``: six system prompts whose effects take four values ~ N(0, 0.35), three of the
  prompts sharing one of them (a plateau the search cannot tell apart).
- d[j] ~ N(0, 1): case difficulty; cases are of three types, h[type, model] ~ N(0, 0.3).
- s[j] ~ log-uniform(0.3, 2): each case has its own noise level (heteroscedastic).
- Half the cases are exact-match: the score is 0 or 1 (Bernoulli(sigmoid(logit)) with
  s[j] * e[c, j] left out); the others are sigmoid(logit), judge-like. Two cells in a hundred
  are failures scored 0 (an unparsable answer), whatever the config.

A config's true score is its mean over the 40 cases, as in generate.py.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

N_CASES = 40
MODELS = ("m-a", "m-b", "m-c", "m-d", "m-e")
SYSTEM_PROMPTS = ("sp-0", "sp-1", "sp-2", "sp-3", "sp-4", "sp-5")
TEMPERATURES = tuple(round(0.1 * i, 1) for i in range(13))  # 0.0-1.2
MAX_TOKENS = (128, 256, 512, 1024, 2048)
FEW_SHOT = (0, 1, 2, 4, 8)
PARAMS = ("model", "system_prompt", "temperature", "max_tokens", "few_shot")


def build(seed: int) -> tuple[list[tuple], np.ndarray]:
    """Every config (model, system_prompt, temperature, max_tokens, few_shot) and its scores on
    the 40 test cases (rows: configs), rounded to 3 decimals."""
    rng = np.random.default_rng(seed)
    nm, npr = len(MODELS), len(SYSTEM_PROMPTS)
    base = rng.normal(0.0, 0.5, nm)
    t_best = rng.uniform(0.0, 1.1, nm)
    curv = rng.uniform(1.0, 4.0, nm)
    shot = rng.normal(0.15, 0.2, nm)
    w3 = rng.normal(0.0, 0.8, nm)
    long = rng.uniform(0.0, 1.0, nm)
    levels = rng.normal(0.0, 0.35, 4)
    plateau = levels[rng.permutation([0, 0, 0, 1, 2, 3])]
    shot_prompt = rng.normal(0.0, 0.25, npr)
    d = rng.normal(0.0, 1.0, N_CASES)
    types = rng.integers(0, 3, N_CASES)
    h = rng.normal(0.0, 0.3, (3, nm))
    s = np.exp(rng.uniform(np.log(0.3), np.log(2.0), N_CASES))
    binary = rng.permutation(np.arange(N_CASES) < N_CASES // 2)

    configs = list(itertools.product(MODELS, SYSTEM_PROMPTS, TEMPERATURES, MAX_TOKENS, FEW_SHOT))
    m = np.array([MODELS.index(c[0]) for c in configs])
    p = np.array([SYSTEM_PROMPTS.index(c[1]) for c in configs])
    t = np.array([c[2] for c in configs])
    tok = np.array([c[3] for c in configs], dtype=float)
    k = np.array([c[4] for c in configs], dtype=float)
    q = (
        base[m]
        + plateau[p]
        - curv[m] * (t - t_best[m]) ** 2
        + shot[m] * np.log1p(k) / np.log(9.0)
        + shot_prompt[p] * (k > 0)
        + w3[m] * (t - 0.6) * np.log2(tok / 512.0) / 2.0
        - 0.8 * (tok == 128) * long[m]
    )
    logit = q[:, None] - d[None, :] + h[types][:, m].T
    noisy = logit + s[None, :] * rng.normal(0.0, 1.0, logit.shape)
    prob = 1.0 / (1.0 + np.exp(-logit))
    exact = (rng.uniform(size=logit.shape) < prob).astype(float)
    scores = np.where(binary[None, :], exact, 1.0 / (1.0 + np.exp(-noisy)))
    scores[rng.uniform(size=scores.shape) < 0.02] = 0.0
    return configs, np.round(scores, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7201)
    args = parser.parse_args()
    configs, scores = build(args.seed)
    true = scores.mean(1)
    print(
        f"{len(configs)} configs x {N_CASES} cases; best true score {true.max():.3f}; "
        f"configs within 95% of it: {(true >= 0.95 * true.max()).sum()}"
    )


if __name__ == "__main__":
    main()
