"""Fast checks of bench/bbob's statistics, held-out guard and IPOP loop:
``.venv/bin/python -m pytest bench/bbob/test_run.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import tune


def rows(fly: list[float], **peers: list[float]) -> list[dict]:
    out = []
    for i, v in enumerate(fly):
        r = {"flywheel": {"normalized_regret": v}}
        r.update({p: {"normalized_regret": vals[i]} for p, vals in peers.items()})
        out.append(r)
    return out


def test_ratio_is_against_the_best_peer_with_an_interval_around_it():
    rs = rows([0.2, 0.4, 0.3, 0.5], a=[0.4, 0.8, 0.6, 1.0], b=[0.3, 0.5, 0.4, 0.6])
    value, lo, hi = run.bootstrap_ratio(rs, "flywheel", ("a", "b"))
    assert value == pytest.approx(1.4 / 1.8, abs=1e-3)  # b is the best peer (mean 0.45)
    assert lo <= value <= hi < 1.0


def test_a_goal_can_be_missed():
    ones = [1, 1, 1]
    rs = rows([0.5, 0.6, 0.7], optuna_gp=[0.2, 0.3, 0.2], optuna_tpe=ones, optuna_cmaes=ones, cmaes_ipop=ones)
    goals = run.check_goals(run.ratios_with_ci(rs))
    assert goals["flywheel_vs_best_peer"]["met"] is False
    assert goals["flywheel_vs_best_peer"]["value"] == pytest.approx(1.8 / 0.7, abs=1e-3)
    assert goals["flywheel_vs_best_peer_ci_high"]["met"] is False


@pytest.mark.parametrize(
    "argv",
    [["--instances", "1-2"], ["--instances", "11"], ["--dims", "5"], ["--dims", "3,10"], ["--dims", "7"]],
)
def test_scoring_refuses_problems_seen_while_tuning(argv, capsys):
    with pytest.raises(SystemExit):
        run.main(argv)
    assert "error: --" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--instances", "16"], ["--dims", "3"], ["--instances", "1"]])
def test_tuning_refuses_the_scored_problems(argv, capsys):
    with pytest.raises(SystemExit):
        tune.main(argv)
    assert "are not tuning" in capsys.readouterr().err


class Box2:
    """A 2-d objective on [-5, 5]^2 that counts its calls."""

    lower_bounds = (-5.0, -5.0)
    upper_bounds = (5.0, 5.0)

    def __init__(self, f):
        self.f, self.calls = f, 0

    def __call__(self, x):
        self.calls += 1
        return float(self.f(x))


def test_ipop_spends_the_budget_exactly_and_converges_on_a_sphere():
    pytest.importorskip("cmaes")
    sphere = Box2(lambda x: sum(v * v for v in x))
    best, overhead, _ = run.run_ipop(sphere, seed=3)
    assert sphere.calls == run.BUDGET
    assert best < 1e-3 and overhead >= 0


def test_ipop_restarts_when_cma_es_stalls():
    pytest.importorskip("cmaes")
    flat = Box2(lambda x: 1.0)  # no progress: should_stop() fires and the loop restarts
    _, _, restarts = run.run_ipop(flat, seed=3)
    assert flat.calls == run.BUDGET
    assert restarts >= 1


def test_held_out_instances_are_new_problems():
    pytest.importorskip("cocoex")
    a, b = run.problem(1, 3, 1), run.problem(1, 3, 16)
    x = [0.5, -1.0, 2.0]
    assert a(x) != b(x)
    assert run.f_opt(1, 3, 16) != run.f_opt(1, 3, 1)


def test_a_rows_file_resumes_only_complete_problems(tmp_path):
    path = tmp_path / "rows.jsonl"
    full = {"f": 1, "dim": 3, "instance": 16, **{m: {"normalized_regret": 0.5} for m in run.METHODS}}
    partial = {"f": 2, "dim": 3, "instance": 16, "flywheel": {"normalized_regret": 0.5}}
    path.write_text(json.dumps(full) + "\n" + json.dumps(partial) + "\n")
    assert list(run.load_rows(path, run.METHODS)) == [(1, 3, 16)]
    assert run.load_rows(tmp_path / "absent.jsonl", run.METHODS) == {}


def test_a_rows_file_resumes_only_rows_of_the_same_code_and_settings(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    base = {"dim": 3, "instance": 16, **{m: {"normalized_regret": 0.5} for m in run.METHODS}}
    lines = [
        {**base, "f": 1, "code": "abc", "overrides": {}},
        {**base, "f": 2, "code": "old", "overrides": {}},  # the search changed since
        {**base, "f": 3, "code": "abc", "overrides": {"n_init": 4}},  # a tuning variant's row
        {**base, "f": 4},  # written before rows carried their code
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert list(run.load_rows(path, run.METHODS, "abc", {})) == [(1, 3, 16)]
    assert "3 rows from other code or settings are not reused" in capsys.readouterr().err
    assert list(run.load_rows(path, run.METHODS, "abc", {"n_init": 4})) == [(3, 3, 16)]
