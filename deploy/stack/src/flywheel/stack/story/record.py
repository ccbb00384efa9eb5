"""What one telling of the story produced: the figures, curves and ids each stage hands to
the next stage, to the report and to the end-to-end tests.

The record is plain JSON (``StoryRecord.to_json``) so a report can be rebuilt from a saved run
and a test can compare two runs (an undisturbed one and the kill drill). Every stage fills its
own section; a stage that did not run leaves its section ``None``. Field meanings:

``meta``: commit, command line, started_at (ISO-8601 UTC), seconds, machine, sizes, models.

``optimize`` (stage 1, batch search with the society on)
    run_id, state, seconds, evaluations, evaluations_failed, best_score, best_config,
    curve: [{"evaluation": int, "score": float, "best": float, "origin": "search"|"rlp"|...}]
        (the run's candidates in evaluation order, best-so-far alongside),
    rlp: {steps, steps_failed, failures, proposals, proposals_resolved, hit_rate,
          mean_reward, reward_definitions},
    sao: {round_id, dataset_id, manifest_uri, pairs, attempted, dropped: {reason: n}, state}.

``traffic`` (stage 2, the best configs as arms, simulated product traffic)
    endpoint, seconds, decisions, feedback_sent, feedback_applied, traces,
    arms: [{"arm_id", "params", "true_rate", "batch_score"}],
    timeline: [{"decision": int, "shares": {arm: share of the last window},
                "posterior": {arm: {"alpha", "beta", "mean"}}}].

``training`` (stage 3, pairs from traces + SAO pairs -> DPO -> policy v1 -> canary arm)
    seconds, trace_pairs, sao_pairs, trace_dataset_uri, source_traces: [trace ids],
    dataset_id, dataset_manifest_uri, job_id, job_state, base_model,
    steps: [{"step", "loss", "reward_margin"?, "learning_rate"?}],
    policy_id, policy_name, version, arm_id, served_model.

``canary`` (stage 4, the bandit decides; the registry follows)
    seconds, decisions, decision: "promoted"|"rolled_back"|"undecided",
    arm_status, policy_status, true_rate,
    timeline: [{"decision": int, "p_better": float, "canary_share": float,
                "canary": {"alpha","beta"}, "incumbent": {"alpha","beta"}}].

``lineage``: [{"kind": "trace"|"trace_dataset"|"sao_dataset"|"dataset"|"job"|"policy"|"arm"|
               "decision", "id": str, "from": [ids]}], the chain from traces to the served arm.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StoryRecord:
    """Sections are plain dicts (see the module docstring for their keys)."""

    meta: dict[str, Any] = field(default_factory=dict)
    optimize: dict[str, Any] | None = None
    traffic: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    canary: dict[str, Any] | None = None
    lineage: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)

    def save(self, path: Path) -> Path:
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: Path) -> StoryRecord:
        return cls(**json.loads(path.read_text()))
