"""RLPConfig: The Convergence's names and defaults, refusals naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flywheel.society.rlp import RLPConfig


def test_defaults_are_the_convergence_and_the_paper() -> None:
    cfg = RLPConfig()
    assert (cfg.rlp_enabled, cfg.buffer_size, cfg.gamma, cfg.gae_lambda, cfg.ema_decay) == (
        False,
        10_000,
        0.99,
        0.95,
        0.999,
    )
    assert cfg.normalize_rewards and cfg.use_logprobs and cfg.thought_length == 500 and cfg.temperature == 0.7
    assert cfg.num_thoughts >= 2 and cfg.baseline == "base_model"
    assert cfg.baseline_model == cfg.model_name
    assert RLPConfig(model_name="reasoner-v2", base_model_name="smollm2").baseline_model == "smollm2"


@pytest.mark.parametrize(
    ("fields", "name"),
    [({"num_thoughts": 1}, "num_thoughts"), ({"gamma": 1.2}, "gamma"), ({"gae_lamda": 0.9}, "gae_lamda")],
)
def test_bad_settings_name_the_field(fields: dict, name: str) -> None:
    with pytest.raises(ValidationError, match=name):
        RLPConfig(**fields)
