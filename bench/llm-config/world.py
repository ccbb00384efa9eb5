"""The tables the llm-config benchmark scores: every config of a search space x every test case.

``TABLES`` names each table by generator and seed. ``tuning`` (table.csv, generate.py's seed
2024) is the one Flywheel's search settings were tuned on; ``a-*`` are generate.py's model with
other seeds, ``b-*`` generate_b.py's (a different structure); neither was used for tuning.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import generate
import generate_b
import numpy as np

from flywheel.optimizer.search import CATEGORICAL, CONTINUOUS, DISCRETE, Param, SearchSpace

HERE = Path(__file__).resolve().parent

# name -> (generator, seed, held out). Seed 2024 is the tuning table; the others were picked
# after the tuning and never used to choose anything.
TABLES: dict[str, tuple[str, int, bool]] = {
    "tuning": ("a", 2024, False),
    "a-7101": ("a", 7101, True),
    "a-7102": ("a", 7102, True),
    "a-7103": ("a", 7103, True),
    "b-7201": ("b", 7201, True),
    "b-7202": ("b", 7202, True),
    "b-7203": ("b", 7203, True),
}

# Each generator's parameters: (name, kind, values). Continuous ones are searched on [low, high]
# with the grid's step and snapped to the grid to look the score up.
SPACES: dict[str, tuple[tuple[str, str, tuple], ...]] = {
    "a": (
        ("model", CATEGORICAL, tuple(generate.MODELS)),
        ("prompt", CATEGORICAL, generate.PROMPTS),
        ("temperature", CONTINUOUS, generate.TEMPERATURES),
        ("max_tokens", DISCRETE, generate.MAX_TOKENS),
        ("top_p", DISCRETE, generate.TOP_P),
    ),
    "b": (
        ("model", CATEGORICAL, generate_b.MODELS),
        ("system_prompt", CATEGORICAL, generate_b.SYSTEM_PROMPTS),
        ("temperature", CONTINUOUS, generate_b.TEMPERATURES),
        ("max_tokens", DISCRETE, generate_b.MAX_TOKENS),
        ("few_shot", DISCRETE, generate_b.FEW_SHOT),
    ),
}


@dataclass
class Table:
    """Scores of every (config, case); a config's true score is its row mean."""

    name: str
    params: tuple[tuple[str, str, tuple], ...]
    configs: list[tuple]
    scores: np.ndarray
    held_out: bool = True
    row: dict[tuple, int] = field(init=False)

    def __post_init__(self) -> None:
        self.row = {c: i for i, c in enumerate(self.configs)}
        self.true = self.scores.mean(1)
        self.best_true = float(self.true.max())
        self.target = 0.95 * self.best_true
        self.cases = [f"case-{j:02d}" for j in range(self.scores.shape[1])]

    def key(self, config: dict[str, Any]) -> tuple:
        """The table row of a config as a search proposes it (numbers snapped to the grid)."""
        out = []
        for name, kind, values in self.params:
            v = config[name]
            if kind != CATEGORICAL:
                v = min(values, key=lambda x: abs(float(x) - float(v)))
            out.append(v)
        return tuple(out)

    def index(self, config: dict[str, Any]) -> int:
        return self.row[self.key(config)]

    def space(self) -> SearchSpace:
        out = []
        for name, kind, values in self.params:
            if kind == CONTINUOUS:
                step = round(values[1] - values[0], 10)
                out.append(Param(name, CONTINUOUS, low=values[0], high=values[-1], step=step))
            else:
                out.append(Param(name, kind, values=tuple(values)))
        return SearchSpace(out)

    def summary(self) -> dict[str, Any]:
        return {
            "configs": len(self.configs),
            "test_cases": len(self.cases),
            "best_true_score": round(self.best_true, 4),
            "target": round(self.target, 4),
            "configs_within_target": int((self.true >= self.target).sum()),
            "held_out": self.held_out,
        }


def read_csv(path: Path, params: tuple[tuple[str, str, tuple], ...]) -> tuple[list[tuple], np.ndarray]:
    with path.open() as f:
        rows = list(csv.reader(f))
    configs, scores = [], []
    for r in rows[1:]:
        n = len(params)
        key = tuple(
            v if kind == CATEGORICAL else type(values[0])(float(v))
            for v, (_, kind, values) in zip(r[:n], params, strict=True)
        )
        configs.append(key)
        scores.append([float(x) for x in r[n:]])
    return configs, np.array(scores)


def load(name: str) -> Table:
    """A table of ``TABLES`` by name (``tuning`` is read from table.csv, the rest generated)."""
    if name not in TABLES:
        raise ValueError(f"table: unknown {name!r}; known: {', '.join(TABLES)}")
    gen, seed, held_out = TABLES[name]
    params = SPACES[gen]
    if name == "tuning":
        configs, scores = read_csv(HERE / "table.csv", params)
    else:
        configs, scores = (generate if gen == "a" else generate_b).build(seed)
    return Table(name, params, configs, scores, held_out)
