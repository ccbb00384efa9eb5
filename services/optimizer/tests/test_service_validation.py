"""flywheel.optimizer.spec.validate_endpoint: what CreateEndpoint refuses, and the message it gives."""

from __future__ import annotations

import dataclasses
import math

import grpc
import pytest

from flywheel.core.errors import InvalidArgument
from flywheel.optimizer.spec import ArmSpec, EndpointSpec, PolicyConfig, validate_endpoint


def _spec(**changes) -> EndpointSpec:
    policy_changes = {
        k: changes.pop(k) for k in list(changes) if k in {f.name for f in dataclasses.fields(PolicyConfig)}
    }
    if "policy_kind" in changes:
        policy_changes["kind"] = changes.pop("policy_kind")
    changes["policy"] = PolicyConfig(**policy_changes)
    base = EndpointSpec(
        name="support-bot",
        arms=[ArmSpec("gpt-small", {"model": "small"}), ArmSpec("gpt.large_v2", {"model": "large"})],
        signal_weights={"thumbs_up": 1.0, "resolved": 2.0},
    )
    return dataclasses.replace(base, **changes)


def _rejected(spec: EndpointSpec) -> str:
    with pytest.raises(InvalidArgument) as exc:
        validate_endpoint(spec)
    return str(exc.value)


def test_a_good_endpoint_passes():
    validate_endpoint(_spec())
    validate_endpoint(_spec(name="x" * 64, arms=[ArmSpec("a" * 128, {})]))
    validate_endpoint(_spec(exploration_floor=0.5))  # 0.5 x 2 arms = 1
    validate_endpoint(_spec(arms=[ArmSpec("a", {}), ArmSpec("b", {}, status="canary", traffic_cap=0.1)]))
    validate_endpoint(_spec(signal_weights={"unused": 0.0}))


def test_invalid_argument_maps_to_the_grpc_code():
    assert InvalidArgument.code is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("name", ["", "support.bot", "x" * 65, "has space", "star*", "gt>", "ümlaut"])
def test_bad_endpoint_name(name):
    message = _rejected(_spec(name=name))
    assert "endpoint name" in message
    assert repr(name) in message
    assert "1-64" in message


def test_endpoint_name_with_trailing_newline_is_rejected():
    _rejected(_spec(name="support-bot\n"))


def test_arm_id_with_trailing_newline_is_rejected():
    _rejected(_spec(arms=[ArmSpec("gpt-small\n", {})]))


def test_no_arms():
    assert "at least one arm" in _rejected(_spec(arms=[]))


def test_duplicate_arm_ids():
    message = _rejected(_spec(arms=[ArmSpec("a", {"t": 1}), ArmSpec("b", {}), ArmSpec("a", {"t": 2})]))
    assert "duplicate arm ids" in message
    assert "support-bot" in message


@pytest.mark.parametrize("arm_id", ["", "has space", "a/b", "x" * 129, "star*"])
def test_bad_arm_id(arm_id):
    message = _rejected(_spec(arms=[ArmSpec(arm_id, {})]))
    assert "arm_id" in message
    assert repr(arm_id) in message


@pytest.mark.parametrize("cap", [0.0, -0.5, 1.0001, 2.0, math.nan])
def test_traffic_cap_outside_zero_one(cap):
    message = _rejected(_spec(arms=[ArmSpec("a", {}, traffic_cap=cap)]))
    assert "traffic_cap" in message
    assert "'a'" in message


def test_a_new_arm_cannot_start_retired():
    message = _rejected(_spec(arms=[ArmSpec("a", {}, status="retired")]))
    assert "active or canary" in message


def test_unknown_policy():
    message = _rejected(_spec(policy_kind="epsilon_greedy"))
    assert "'epsilon_greedy'" in message
    assert "thompson_beta" in message  # says what is available


def test_unbounded_rewards_with_thompson_beta():
    message = _rejected(_spec(bounded=False))
    assert "thompson_beta" in message
    assert "bounded" in message


@pytest.mark.parametrize("floor", [-0.1, 0.51, math.nan])
def test_exploration_floor_out_of_range(floor):
    assert "exploration_floor" in _rejected(_spec(exploration_floor=floor))


@pytest.mark.parametrize("weight", [-1.0, -1e-9, math.nan, math.inf])
def test_negative_or_non_finite_signal_weight(weight):
    message = _rejected(_spec(signal_weights={"thumbs_up": 1.0, "resolved": weight}))
    assert "signal weights" in message
    assert "finite and non-negative" in message


def test_only_canaries_is_refused():
    assert "at least one active" in _rejected(_spec(arms=[ArmSpec("a", {}, status="canary", traffic_cap=0.1)]))


def test_half_life_and_window_together_are_refused():
    assert "at most one of half_life_s and window_s" in _rejected(_spec(half_life_s=60, window_s=600))


def test_linear_thompson_needs_features():
    assert "context_features" in _rejected(_spec(policy_kind="linear_thompson"))
    validate_endpoint(_spec(policy_kind="linear_thompson", context_features=("x1", "x2")))
    assert "only apply to linear_thompson" in _rejected(_spec(context_features=("x1",)))


def test_allocation_must_be_thompson_or_ids_and_ids_is_not_contextual():
    assert "'ucb'" in _rejected(_spec(allocation="ucb"))
    validate_endpoint(_spec(allocation="ids"))
    message = _rejected(_spec(policy_kind="linear_thompson", context_features=("x1",), allocation="ids"))
    assert "not linear_thompson" in message


def test_gaussian_policy_accepts_unbounded_rewards():
    validate_endpoint(_spec(policy_kind="thompson_gaussian", bounded=False))
