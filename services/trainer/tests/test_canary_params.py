"""The canary arm's params: the incumbent's, with the served model (provider prefix kept) and
the version's policy id; the incumbent is the endpoint's incumbent arm when it is active."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.core.errors import FailedPrecondition
from flywheel.trainer.registry.canary import canary_params, incumbent_arm


def arm(arm_id: str, model: str, status: int = ep_pb.ARM_STATUS_ACTIVE, **extra: object) -> ep_pb.Arm:
    params = Struct()
    params.update({"model": model, **extra})
    return ep_pb.Arm(arm_id=arm_id, params=params, status=status)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "served"),
    [
        ("openai/smollm2-135m-instruct", "openai/support-v3"),
        ("hosted_vllm/org/model", "hosted_vllm/support-v3"),
        ("smollm2-135m-instruct", "support-v3"),
    ],
)
def test_model_replaced_provider_prefix_kept(model: str, served: str) -> None:
    incumbent = arm("base", model, temperature=0.2, api_base="http://127.0.0.1:8000/v1")
    got = json_format.MessageToDict(canary_params(incumbent, "support-v3", "p3"))
    assert got == {"model": served, "temperature": 0.2, "api_base": "http://127.0.0.1:8000/v1", "policy_id": "p3"}
    assert incumbent.params["model"] == model  # the incumbent's own params are left alone


def test_the_incumbent_is_the_endpoints_incumbent_when_active_else_the_first_active_arm() -> None:
    arms = [arm("old", "a", ep_pb.ARM_STATUS_RETIRED), arm("first", "b"), arm("best", "c"), arm("new", "d", 2)]
    assert incumbent_arm(ep_pb.Endpoint(name="e", arms=arms, incumbent_arm_id="best")).arm_id == "best"
    assert incumbent_arm(ep_pb.Endpoint(name="e", arms=arms, incumbent_arm_id="old")).arm_id == "first"
    assert incumbent_arm(ep_pb.Endpoint(name="e", arms=arms)).arm_id == "first"
    with pytest.raises(FailedPrecondition, match="no active arm"):
        incumbent_arm(ep_pb.Endpoint(name="e", arms=arms[:1]))
