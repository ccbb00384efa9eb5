"""Fast checks of the SDK pieces that need no server: DecisionContext, the Convergence
config shapes, CLI argument parsing and error lines."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from flywheel.sdk import cli
from flywheel.sdk.convergence import endpoint_from_config
from flywheel.sdk.decision import Decision, DecisionContext, check_feedback
from flywheel.sdk.endpoint_file import EndpointFileError
from flywheel.sdk.sync import SyncFlywheelClient

DECISION = Decision(decision_id="d1", endpoint="bot", arm_id="a", params={"model": "m"}, probability=0.5)


def test_decision_context_collects_reward_signals_and_cost():
    ctx = DecisionContext(DECISION)
    assert ctx.params == {"model": "m"} and ctx.decision_id == "d1" and ctx.arm_id == "a"
    ctx.set_reward(0.8)
    ctx.add_signal("quality", 0.9)
    ctx.add_cost(0.001)
    ctx.add_cost(0.002)
    reward, signals = ctx._outcome(12.5, failed=False)
    assert reward == 0.8
    assert signals == {"quality": 0.9, "latency_ms": 12.5, "cost_usd": pytest.approx(0.003)}
    with pytest.raises(RuntimeError, match="already reported"):
        ctx.set_reward(1.0)


def test_decision_context_failure_is_reward_zero_with_error_signal():
    ctx = DecisionContext(DECISION)
    ctx.set_reward(1.0)
    reward, signals = ctx._outcome(3.0, failed=True)
    assert reward == 0.0 and signals == {"latency_ms": 3.0, "error": 1.0}  # no cost_usd: never set


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.set_reward(math.nan), "finite"),
        (lambda c: c.add_signal("q", math.inf), "finite"),
        (lambda c: c.add_signal("latency_ms", 1.0), "measured by decide"),
        (lambda c: c.add_signal("cost_usd", 1.0), "add_cost"),
        (lambda c: c.add_signal("", 1.0), "name"),
        (lambda c: c.add_cost(-1), ">= 0"),
        (lambda c: c.set_reward(True), "finite number"),
    ],
)
def test_decision_context_rejects_bad_values(call, match):
    with pytest.raises(ValueError, match=match):
        call(DecisionContext(DECISION))


def test_check_feedback():
    check_feedback(0.5, None)
    check_feedback(None, {"q": 1})
    with pytest.raises(ValueError, match="reward or at least one signal"):
        check_feedback(None, {})
    with pytest.raises(ValueError, match="finite"):
        check_feedback(None, {"q": math.nan})


# The Convergence's runtime config classes, reduced to the fields the mapping reads.
class RuntimeArmTemplate(BaseModel):
    arm_id: str
    name: str | None = None
    params: dict = {}
    description: str | None = None


class SelectionStrategyConfig(BaseModel):
    exploration_bonus: float = 0.0
    stability_confidence_threshold: float = 0.2
    stability_improvement_threshold: float = 0.1
    stability_min_pulls: int = 10
    use_stability: bool = True


class RewardMetricConfig(BaseModel):
    name: str
    weight: float


class RewardEvaluatorConfig(BaseModel):
    metrics: dict[str, RewardMetricConfig]


class RuntimeConfig(BaseModel):
    system: str
    agent_type: str | None = None
    min_arms: int = 1
    cache_ttl_seconds: int = 30
    default_arms: list[RuntimeArmTemplate] = []
    selection_strategy: SelectionStrategyConfig | None = None
    reward_evaluator: RewardEvaluatorConfig | None = None


def test_convergence_runtime_config_maps_to_an_endpoint():
    config = RuntimeConfig(
        system="bot",
        default_arms=[
            RuntimeArmTemplate(arm_id="fast", name="Fast", params={"model": "mini"}),
            RuntimeArmTemplate(arm_id="smart", params={"model": "big"}, description="slow"),
        ],
        selection_strategy=SelectionStrategyConfig(stability_min_pulls=20, stability_improvement_threshold=0.05),
        reward_evaluator=RewardEvaluatorConfig(
            metrics={"rating": RewardMetricConfig(name="rating", weight=0.7), "engaged": {"name": "e", "weight": 0.3}}
        ),
    )
    ep = endpoint_from_config("bot", config)
    assert [(a.arm_id, a.params) for a in ep.arms] == [("fast", {"model": "mini"}), ("smart", {"model": "big"})]
    assert ep.policy.incumbent.min_pulls == 20
    assert ep.policy.incumbent.min_margin == 0.05
    assert ep.policy.incumbent.max_interval_width == 0.2
    assert ep.reward.signal_weights == {"rating": 0.7, "engaged": 0.3}


def test_convergence_config_as_dict_flywheel_shape_and_param_list():
    as_dict = endpoint_from_config("bot", {"system": "bot", "default_arms": [{"arm_id": "x", "params": {"t": 1}}]})
    assert [a.arm_id for a in as_dict.arms] == ["x"]
    flywheel_shape = endpoint_from_config(
        "bot", {"arms": [{"arm_id": "x", "params": {}}], "policy": {"kind": "thompson_gaussian"}}
    )
    assert flywheel_shape.policy.kind == "thompson_gaussian" and not flywheel_shape.bounded
    listed = endpoint_from_config("bot", [{"model": "a"}, {"model": "b"}])
    assert [(a.arm_id, a.params) for a in listed.arms] == [("arm-0", {"model": "a"}), ("arm-1", {"model": "b"})]


def test_convergence_config_errors_name_the_field():
    with pytest.raises(EndpointFileError, match=r"arms\[0\] \('a b'\).arm_id"):
        endpoint_from_config("bot", {"arms": [{"arm_id": "a b", "params": {}}]})
    with pytest.raises(ValueError, match="names endpoint 'other'"):
        endpoint_from_config("bot", {"name": "other", "arms": [{"model": "a"}]})
    with pytest.raises(ValueError, match="arm 0"):
        endpoint_from_config("bot", ["not a mapping"])


def test_cli_argument_types():
    assert cli.distribution("a=0.5, b=0.5") == {"a": 0.5, "b": 0.5}
    for bad in ("a", "a=x", "=0.5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.distribution(bad)
    assert cli.iso_time("2025-01-02T03:04:05Z") == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert cli.iso_time("2025-01-02").tzinfo is UTC
    with pytest.raises(argparse.ArgumentTypeError):
        cli.iso_time("yesterday")
    assert cli.confidence("0.9") == 0.9
    for bad in ("1", "0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.confidence(bad)


def test_cli_ope_needs_exactly_one_candidate(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["ope", "bot"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["ope", "bot", "--arm", "a", "--current"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_unreachable_optimizer_is_one_error_line_and_a_hint(capsys):
    assert cli.main(["endpoint", "list", "--target", "127.0.0.1:1", "--timeout", "3"]) == 1
    error, hint = capsys.readouterr().err.splitlines()
    assert error.startswith("error: UNAVAILABLE: optimizer at 127.0.0.1:1: ")
    assert hint.startswith("hint: 127.0.0.1:1 came from --target.") and "flywheel-stack env" in hint


def test_cli_invalid_file_lists_problems(tmp_path, capsys):
    path = tmp_path / "ep.yaml"
    path.write_text("name: a.b\narms: []\n")
    assert cli.main(["endpoint", "apply", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is invalid:\n")
    assert "  name: must be 1-64 chars" in err and "  arms: List should have at least 1 item" in err
    assert "Traceback" not in err


def test_sync_client_without_nats_and_close_is_idempotent():
    client = SyncFlywheelClient(target="127.0.0.1:1")
    with pytest.raises(RuntimeError, match="no nats_url"):
        client.feedback(DECISION, reward=1.0)
    client.close()
    client.close()


def test_integral_param_numbers_come_back_as_ints():
    from google.protobuf.struct_pb2 import Struct

    from flywheel.api.optimizer.v1 import selection_service_pb2 as sel_pb
    from flywheel.sdk._transport import decision_from

    params = {"max_tokens": 256, "temperature": 0.5, "big": 2.0**60, "neg": -3, "nested": [{"k": 4}, 1.5, "s"]}
    struct = Struct()
    struct.update(params)
    resp = sel_pb.SelectResponse(decision_id="d", arm_id="a", params=struct, probability=1.0)
    got = decision_from("ep", resp).params
    assert got["max_tokens"] == 256 and type(got["max_tokens"]) is int
    assert type(got["neg"]) is int and type(got["nested"][0]["k"]) is int
    assert type(got["temperature"]) is float and got["nested"][1] == 1.5
    assert type(got["big"]) is float  # beyond 2**53 a double is not an exact integer: left alone
    assert type(decision_from("ep", resp, int_params=False).params["max_tokens"]) is float


def test_runtime_feedback_ids_are_stable_per_decision_and_key():
    from flywheel.sdk.convergence import feedback_id_for

    assert feedback_id_for("d-1") == feedback_id_for("d-1") != feedback_id_for("d-2")
    assert feedback_id_for("d-1", "click") != feedback_id_for("d-1") != feedback_id_for("d-1", "buy")
    assert len(feedback_id_for("x" * 500, "y" * 500)) <= 128  # the optimizer's feedback_id limit


def test_endpoint_json_prints_counters_as_numbers() -> None:
    """`flywheel endpoint get --json`: pulls are JSON numbers (protobuf's JSON writes int64 as
    strings, which scripts then compare wrongly)."""
    from flywheel.api.optimizer.v1 import endpoints_pb2
    from flywheel.sdk.cli import _endpoint_json

    ep = endpoints_pb2.Endpoint(name="e", stats=[endpoints_pb2.ArmStats(arm_id="a", pulls=3, alpha=2.5)])
    out = _endpoint_json(ep)
    assert out["stats"][0]["pulls"] == 3 and isinstance(out["stats"][0]["pulls"], int)
    assert out["stats"][0]["alpha"] == 2.5
