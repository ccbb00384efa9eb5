"""obp 0.4.1's own estimators and BernoulliTS, loaded from the pinned wheel without installing obp.

obp's package ``__init__`` files import its plotting and learning modules (matplotlib, seaborn,
torch learners); only ``obp.ope.estimators`` (numpy, torch, and ``obp.utils``: pandas,
scikit-learn) and ``obp.policy.contextfree`` (numpy, PyYAML, scikit-learn) are needed here.
The wheel is extracted next to itself (BernoulliTS reads its prior from a file path, so a
zip import would not do), and ``obp.ope`` / ``obp.policy`` are registered as bare packages
whose ``__path__`` points into the extracted folder, so their ``__init__`` never runs.
"""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Obp:
    """The obp pieces the bench calls."""

    version: str
    ipw: Any  # obp.ope.InverseProbabilityWeighting()
    snipw: Any  # obp.ope.SelfNormalizedInverseProbabilityWeighting()
    dr: Any  # obp.ope.DoublyRobust()
    bernoulli_ts: type  # obp.policy.BernoulliTS


def load(wheel: Path) -> Obp:
    """Import obp's estimators and BernoulliTS from ``wheel`` (extracted once beside it)."""
    folder = wheel.with_suffix("")  # bench/.cache/obp-0.4.1-py3-none-any/
    if not (folder / "obp" / "ope" / "estimators.py").exists():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(folder)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    obp = importlib.import_module("obp")  # its __init__ only reads the version
    for sub in ("ope", "policy"):
        name = f"obp.{sub}"
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(folder / "obp" / sub)]
            sys.modules[name] = stub
            setattr(obp, sub, stub)
    est = importlib.import_module("obp.ope.estimators")
    contextfree = importlib.import_module("obp.policy.contextfree")
    return Obp(
        version=obp.__version__,
        ipw=est.InverseProbabilityWeighting(),
        snipw=est.SelfNormalizedInverseProbabilityWeighting(),
        dr=est.DoublyRobust(),
        bernoulli_ts=contextfree.BernoulliTS,
    )


def estimate(
    obp: Obp,
    *,
    items: np.ndarray,
    positions: np.ndarray,
    clicks: np.ndarray,
    pscore: np.ndarray,
    dist_by_position: np.ndarray,
    reward_model: np.ndarray,
) -> dict[str, float]:
    """obp's IPW, SNIPW and DR point estimates on one log.

    ``dist_by_position``: (n_items, len_list), the evaluation policy's P(item at position),
    the same for every round (obp's ``action_dist`` is that tiled over the rounds).
    ``reward_model``: (n, n_items), the reward model the bench's DR uses, repeated over the
    positions (obp's ``estimated_rewards_by_reg_model`` is (n, n_items, len_list)).
    """
    n = items.shape[0]
    action_dist = np.ascontiguousarray(np.broadcast_to(dist_by_position, (n, *dist_by_position.shape)))
    q = np.repeat(reward_model[:, :, None], dist_by_position.shape[1], axis=2)
    common = {"reward": clicks, "action": items, "pscore": pscore, "action_dist": action_dist, "position": positions}
    return {
        "ips": float(obp.ipw.estimate_policy_value(**common)),
        "snips": float(obp.snipw.estimate_policy_value(**common)),
        "dr": float(obp.dr.estimate_policy_value(**common, estimated_rewards_by_reg_model=q)),
    }


def bts_action_dist(obp: Obp, n_items: int, len_list: int, campaign: str, n_sim: int, seed: int) -> np.ndarray:
    """(n_items, len_list): ``BernoulliTS(is_zozotown_prior=True).compute_batch_action_dist``,
    obp's own Monte Carlo replica of the ZOZOTOWN BTS policy (its README's example)."""
    policy = obp.bernoulli_ts(
        n_actions=n_items, len_list=len_list, is_zozotown_prior=True, campaign=campaign, random_state=seed
    )
    return policy.compute_batch_action_dist(n_rounds=1, n_sim=n_sim)[0]
