"""What a product holds while it serves one request: the ``Decision`` it got from Select,
and the ``DecisionContext`` that ``decide()`` yields to collect how the request went.

Latency, cost and errors are *signals*, not rewards. ``decide()`` always reports
``latency_ms`` (the wall time of the block, in milliseconds), ``cost_usd`` when the block
called ``add_cost``, and ``error=1.0`` when the block raised. What they do to the posterior
is decided by the endpoint's reward spec, on the server:

- A scalar reward (``set_reward``) wins: the posterior moves by it and the signals are
  only recorded (in the trace store, for later analysis and off-policy work).
- Without a scalar reward, the reward is the weighted mean of the signals that are
  *present* and declared in ``reward.signal_weights``. A missing signal is not a zero: a
  request that reported no ``quality`` is judged on the other declared signals only.
- An endpoint that declares no signal weights averages *every* signal with weight 1. On
  such an endpoint a block that sets neither a reward nor a declared signal would be
  rewarded with its raw ``latency_ms`` (clipped to [0, 1] on bounded endpoints), so either
  call ``set_reward`` or declare the signals that should count (for example
  ``{quality: 1.0}``; raw milliseconds and dollars are not rewards in [0, 1], so give them
  weight only once a signal of yours has normalised them).

Integer params. Arm params travel as a protobuf ``Struct``, which stores every number as a
double: ``max_tokens: 256`` would come back as ``256.0``, which OpenAI and most typed APIs
refuse. So ``Decision.params`` turns every number that is integral, finite and within
+-2**53 (where a double holds every integer exactly) back into an ``int``, at any depth.
The cost: a param written as ``1.0`` arrives as ``1`` (equal in Python and in JSON
arithmetic; ``float()`` it where a type check insists). Clients built with
``int_params=False`` keep the doubles as they came.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flywheel.api.values import plain_number

__all__ = ["Decision", "check_feedback", "plain_number"]

LATENCY_SIGNAL = "latency_ms"
COST_SIGNAL = "cost_usd"
ERROR_SIGNAL = "error"


@dataclass(frozen=True)
class Decision:
    """The arm chosen for one request; keep ``decision_id`` to report feedback."""

    decision_id: str
    endpoint: str
    arm_id: str
    params: dict[str, Any]
    probability: float


def check_feedback(reward: float | None, signals: dict[str, float] | None) -> None:
    """Refuse feedback the optimizer would dead-letter: nothing to apply, or a non-finite number."""
    if reward is None and not signals:
        raise ValueError("give a reward or at least one signal")
    values = [*(signals or {}).values(), *([reward] if reward is not None else [])]
    if any(not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) for v in values):
        raise ValueError("reward and signals must be finite numbers")


def _finite(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


class DecisionContext:
    """Yielded by ``decide()``: the chosen params, and the outcome the block reports.

    ``set_reward`` sets the scalar reward (last call wins), ``add_signal`` sets a named
    signal (last value per name wins; ``latency_ms`` and ``cost_usd`` are reserved, and
    ``add_signal("error", 1.0)`` marks a failure the block handled itself), ``add_cost``
    accumulates dollars across calls (one request may call several models). After the
    block has exited the context is sealed.
    """

    __slots__ = ("_cost", "_reward", "_sealed", "_signals", "decision")

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self._reward: float | None = None
        self._signals: dict[str, float] = {}
        self._cost: float | None = None
        self._sealed = False

    @property
    def params(self) -> dict[str, Any]:
        return self.decision.params

    @property
    def decision_id(self) -> str:
        return self.decision.decision_id

    @property
    def arm_id(self) -> str:
        return self.decision.arm_id

    @property
    def reward(self) -> float | None:
        return self._reward

    @property
    def signals(self) -> dict[str, float]:
        return dict(self._signals)

    @property
    def cost_usd(self) -> float | None:
        return self._cost

    def _check_open(self) -> None:
        if self._sealed:
            raise RuntimeError(f"decision {self.decision.decision_id!r} was already reported")

    def set_reward(self, reward: float) -> None:
        self._check_open()
        self._reward = _finite(reward, "reward")

    def add_signal(self, name: str, value: float) -> None:
        self._check_open()
        if not name or not isinstance(name, str):
            raise ValueError("a signal needs a non-empty name")
        if name == LATENCY_SIGNAL:
            raise ValueError(f"{LATENCY_SIGNAL!r} is measured by decide() itself")
        if name == COST_SIGNAL:
            raise ValueError(f"report {COST_SIGNAL!r} with add_cost(), which adds up across calls")
        self._signals[name] = _finite(value, f"signal {name!r}")

    def add_cost(self, usd: float) -> None:
        self._check_open()
        usd = _finite(usd, "cost")
        if usd < 0:
            raise ValueError(f"cost must be >= 0, got {usd}")
        self._cost = (self._cost or 0.0) + usd

    def _outcome(self, latency_ms: float, *, failed: bool) -> tuple[float | None, dict[str, float]]:
        """Seal the context and return the (reward, signals) to report."""
        self._sealed = True
        signals = {**self._signals, LATENCY_SIGNAL: latency_ms}
        if self._cost is not None:
            signals[COST_SIGNAL] = self._cost
        if failed:
            signals[ERROR_SIGNAL] = 1.0
            return 0.0, signals
        return self._reward, signals

    def __repr__(self) -> str:
        return (
            f"DecisionContext(decision_id={self.decision.decision_id!r}, arm_id={self.decision.arm_id!r}, "
            f"reward={self._reward!r}, signals={self._signals!r}, cost_usd={self._cost!r})"
        )
