"""The reward judge client, shared with the trainer: it lives in :mod:`flywheel.core.judge_client`.

The evaluator builds it with ``address_setting="FLYWHEEL_EVALUATOR_JUDGE_ADDRESS"`` so an
unconfigured judge names the evaluator's own setting."""

from flywheel.core.judge_client import JudgeClient, JudgeScore, JudgeUnavailable

ADDRESS_SETTING = "FLYWHEEL_EVALUATOR_JUDGE_ADDRESS"

__all__ = ["ADDRESS_SETTING", "JudgeClient", "JudgeScore", "JudgeUnavailable"]
