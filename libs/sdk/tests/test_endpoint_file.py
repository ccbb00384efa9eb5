"""Endpoint files: the example parses, and each kind of mistake is named by its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.api.optimizer.v1 import endpoints_pb2 as pb
from flywheel.sdk.endpoint_file import EndpointFileError, PolicyFile, load_endpoint_file, parse_endpoint

EXAMPLE = Path(__file__).parents[1] / "examples" / "endpoint.yaml"


def minimal(**changes):
    data = {"name": "bot", "arms": [{"arm_id": "a", "params": {"model": "m"}}, {"arm_id": "b"}]}
    data.update(changes)
    return data


def error_of(data) -> str:
    with pytest.raises(EndpointFileError) as info:
        parse_endpoint(data, source="f.yaml")
    return str(info.value)


def test_example_file_parses_and_converts():
    ep = load_endpoint_file(EXAMPLE)
    assert ep.name == "support-bot"
    assert [a.arm_id for a in ep.arms] == ["small", "large", "creative", "tuned-v2"]
    msg = ep.to_proto()
    assert msg.arms[3].status == pb.ARM_STATUS_CANARY and msg.arms[3].traffic_cap == pytest.approx(0.1)
    assert msg.policy.kind == pb.POLICY_KIND_THOMPSON_BETA
    assert msg.policy.half_life_s == 604800
    assert msg.policy.sticky_sessions
    assert dict(msg.reward_spec.signal_weights) == {"resolved": 0.7, "thumbs_up": 0.3}
    assert msg.reward_spec.bounded


def test_defaults_match_the_optimizer_and_roundtrip_through_proto():
    ep = parse_endpoint(minimal())
    assert ep.policy.kind == "thompson_beta" and ep.bounded
    # The live policy (zeros meaning defaults) reads back as the same values.
    assert PolicyFile.from_proto(pb.PolicySpec()).model_dump() == ep.policy.model_dump()
    assert PolicyFile.from_proto(ep.policy.to_proto()).model_dump() == ep.policy.model_dump()


def test_allocation_ids_reaches_the_proto_and_back():
    ep = parse_endpoint(minimal(policy={"allocation": "ids"}))
    assert ep.to_proto().policy.allocation == pb.ALLOCATION_IDS
    assert PolicyFile.from_proto(ep.policy.to_proto()).allocation == "ids"
    assert PolicyFile.from_proto(pb.PolicySpec()).allocation == "thompson"


def test_forgetting_by_decisions_reaches_the_proto_and_back():
    ep = parse_endpoint(minimal(policy={"half_life_decisions": 500}))
    assert ep.policy.to_proto().half_life_decisions == 500
    assert PolicyFile.from_proto(ep.policy.to_proto()).half_life_decisions == 500
    assert PolicyFile.from_proto(pb.PolicySpec(window_decisions=800)).window_decisions == 800


def test_gaussian_defaults_to_unbounded():
    ep = parse_endpoint(minimal(policy={"kind": "thompson_gaussian"}))
    assert not ep.bounded and not ep.to_proto().reward_spec.bounded


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"arms": [{"arm_id": "a"}]}, "name: required field is missing"),
        (minimal(name="a.b"), "name: must be 1-64 chars of [A-Za-z0-9_-] (it is a NATS subject token) (got 'a.b')"),
        (minimal(arms=[]), "arms: List should have at least 1 item"),
        (minimal(arms=[{"arm_id": "a", "traffic_cap": 1.5}]), "arms[0] ('a').traffic_cap: Input should be less"),
        (
            minimal(arms=[{"arm_id": "a"}, {"arm_id": "b c"}]),
            "arms[1] ('b c').arm_id: must be 1-128 chars of [A-Za-z0-9_.-] (got 'b c')",
        ),
        (minimal(arms=[{"arm_id": "a", "status": "retired"}]), "arms[0] ('a').status: Input should be 'active'"),
        (minimal(arms=[{"arm_id": "a", "parms": {}}]), "arms[0] ('a').parms: unknown field"),
        (minimal(arms=[{"params": {}}]), "arms[0].arm_id: required field is missing"),
        (minimal(arms=[{"arm_id": "a"}, {"arm_id": "a"}]), "arms: duplicate arm_id 'a'"),
        (minimal(arms=[{"arm_id": "a", "status": "canary"}]), "arms: at least one arm must be active"),
        (minimal(polcy={}), "polcy: unknown field"),
        (minimal(policy={"kind": "ucb"}), "policy.kind: Input should be 'thompson_beta'"),
        (minimal(policy={"exploration_floor": 0.6}), "policy.exploration_floor: 0.6 times 2 arms must be at most 1"),
        (minimal(policy={"exploration_floor": -0.1}), "policy.exploration_floor: Input should be greater than"),
        (minimal(policy={"half_life_s": float("nan")}), "policy.half_life_s: Input should be a finite number"),
        (minimal(policy={"half_life_s": 60, "window_s": 60}), "policy: set at most one of half_life_s and window_s"),
        (
            minimal(policy={"half_life_s": 60, "half_life_decisions": 500}),
            "policy: set at most one of half_life_s and half_life_decisions",
        ),
        (minimal(policy={"window_decisions": -1}), "policy.window_decisions: Input should be greater than"),
        (minimal(policy={"kind": "linear_thompson"}), "policy: context_features: linear_thompson needs"),
        (minimal(policy={"allocation": "ucb"}), "policy.allocation: Input should be 'thompson' or 'ids'"),
        (
            minimal(policy={"kind": "linear_thompson", "context_features": ["x"], "allocation": "ids"}),
            "policy: allocation: ids applies to thompson_beta and thompson_gaussian",
        ),
        (
            minimal(policy={"kind": "thompson_beta", "context_features": ["x"]}),
            "policy: context_features only apply to linear_thompson",
        ),
        (minimal(policy={"incumbent": {"min_pulls": 0}}), "policy.incumbent.min_pulls: Input should be greater"),
        (
            minimal(policy={"canary": {"promote_probability": 0.3, "retire_probability": 0.5}}),
            "policy.canary: retire_probability (0.5) must be below promote_probability (0.3)",
        ),
        (minimal(policy={"canary": {"promote_probability": 1.0}}), "policy.canary.promote_probability: Input should"),
        (minimal(reward={"signal_weights": {"q": -1}}), "reward.signal_weights.q: Input should be greater than"),
        (minimal(reward={"bounded": False}), "reward.bounded: thompson_beta needs bounded rewards"),
        (minimal(reward={"weights": {}}), "reward.weights: unknown field"),
        (minimal(arms=[{"arm_id": "a", "params": [1, 2]}]), "arms[0] ('a').params: Input should be a valid dict"),
    ],
)
def test_validation_errors_name_the_field(data, expected):
    assert expected in error_of(data)


def test_every_problem_is_listed():
    message = error_of(minimal(name="a.b", polcy={}, arms=[{"arm_id": "a", "traffic_cap": 0}]))
    assert message.startswith("f.yaml is invalid:")
    assert "name:" in message and "polcy: unknown field" in message and "arms[0] ('a').traffic_cap" in message


def test_numeric_arm_ids_are_text():
    assert parse_endpoint(minimal(arms=[{"arm_id": 1}])).arms[0].arm_id == "1"


def test_file_errors(tmp_path):
    with pytest.raises(EndpointFileError, match="No such file"):
        load_endpoint_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\narms: [\n")
    with pytest.raises(EndpointFileError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load_endpoint_file(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(EndpointFileError, match="expected a mapping"):
        load_endpoint_file(listing)
