"""Generate the llm-config table: every config of a small LLM search space scored on every test
case, with per-case noise. Deterministic (seed 2024); writes table.csv next to this file.
``build(seed)`` makes the same kind of table in memory for another seed (bench/llm-config/run.py
scores held-out tables made that way: seed 2024 is the table Flywheel's search was tuned on).

    python bench/llm-config/generate.py

The model (scores are judge-like values in [0, 1]):

    score[c, j] = sigmoid(q[c] - d[j] + g[j] * cot[c] + e[c, j])

- q[c], the config's quality on the logit scale:
  model base {tiny: -0.8, small: -0.2, medium: 0.3, large: 0.6}
  + prompt effect per model (PROMPT below: few-shot helps small models, chain-of-thought
    helps large ones, "strict" hurts tiny ones)
  - 2.5 * (temperature - t_best[model])^2 with t_best {tiny: 0.1, small: 0.3, medium: 0.5, large: 0.7}
  + max_tokens effect: chain-of-thought needs room (64 tokens: -1.0, 256: -0.2, 1024: 0);
    other prompts lose 0.15 at 1024 (rambling)
  + top_p effect {0.8: 0.05, 0.9: 0.1, 1.0: 0.0}
- d[j] ~ N(0, 0.8): how hard test case j is (shared by all configs);
- g[j] ~ N(0, 0.5) only on "reasoning" cases (a third of them): chain-of-thought helps there;
- e[c, j] ~ N(0, 1.0): the per-case noise, independent per config and case.

A config's true score is its mean over all test cases in the table (what a full evaluation
measures). Evaluating (config, case) returns the table cell: the same answer every time, as
with a cached or temperature-0 call.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 2024
N_CASES = 24
MODELS = {"tiny": -0.8, "small": -0.2, "medium": 0.3, "large": 0.6}
T_BEST = {"tiny": 0.1, "small": 0.3, "medium": 0.5, "large": 0.7}
PROMPTS = ("plain", "cot", "fewshot", "strict")
PROMPT = {
    "tiny": {"plain": 0.0, "cot": -0.4, "fewshot": 0.5, "strict": -0.3},
    "small": {"plain": 0.0, "cot": 0.0, "fewshot": 0.4, "strict": 0.1},
    "medium": {"plain": 0.0, "cot": 0.3, "fewshot": 0.2, "strict": 0.2},
    "large": {"plain": 0.0, "cot": 0.6, "fewshot": 0.1, "strict": 0.3},
}
TEMPERATURES = tuple(round(0.1 * i, 1) for i in range(11))
MAX_TOKENS = (64, 256, 1024)
TOP_P = (0.8, 0.9, 1.0)
PARAMS = ("model", "prompt", "temperature", "max_tokens", "top_p")


def quality(model: str, prompt: str, temperature: float, max_tokens: int, top_p: float) -> float:
    q = MODELS[model] + PROMPT[model][prompt] - 2.5 * (temperature - T_BEST[model]) ** 2
    if prompt == "cot":
        q += {64: -1.0, 256: -0.2, 1024: 0.0}[max_tokens]
    elif max_tokens == 1024:
        q -= 0.15
    return q + {0.8: 0.05, 0.9: 0.1, 1.0: 0.0}[top_p]


def build(seed: int = SEED) -> tuple[list[tuple], np.ndarray]:
    """Every config and its per-case scores (rows: configs, columns: cases) for one seed."""
    rng = np.random.default_rng(seed)
    configs = list(itertools.product(MODELS, PROMPTS, TEMPERATURES, MAX_TOKENS, TOP_P))
    d = rng.normal(0.0, 0.8, N_CASES)
    reasoning = np.arange(N_CASES) % 3 == 0
    g = np.where(reasoning, rng.normal(0.0, 0.5, N_CASES), 0.0)
    q = np.array([quality(*c) for c in configs])
    cot = np.array([c[1] == "cot" for c in configs], dtype=float)
    logits = q[:, None] - d[None, :] + cot[:, None] * g[None, :] + rng.normal(0.0, 1.0, (len(configs), N_CASES))
    # Rounded as the CSV stores them, so an in-memory table equals a written one.
    return configs, np.round(1.0 / (1.0 + np.exp(-logits)), 3)


def main() -> None:
    configs, scores = build(SEED)
    with (HERE / "table.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*PARAMS, *(f"case-{j:02d}" for j in range(N_CASES))])
        for c, row in zip(configs, scores, strict=True):
            w.writerow([*c, *(f"{s:.3f}" for s in row)])
    true = scores.mean(1)
    print(
        f"{len(configs)} configs x {N_CASES} cases; best true score {true.max():.3f}; "
        f"configs within 95% of it: {(true >= 0.95 * true.max()).sum()}"
    )


if __name__ == "__main__":
    main()
