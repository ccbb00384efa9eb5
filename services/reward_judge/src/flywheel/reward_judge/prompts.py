"""The judge's messages: the rubric and the shared prompt once, each response labelled.

One format serves Score (a group of one), Compare (two, in both orders) and Rank (a
group), RULER-style, so one parser reads every answer."""

from __future__ import annotations

import json

from flywheel.reward_judge.parsing import SCALE
from flywheel.reward_judge.rubric import Rubric

SYSTEM = (
    "You are a strict, impartial judge of AI assistant responses. Judge each response on its "
    "own merits against the rubric. The order in which responses are shown means nothing; "
    "length is not quality. Reply with JSON only, no prose, exactly in the requested shape."
)


def label(position: int) -> str:
    """The id of the response shown at ``position`` (0-based): R1, R2, …"""
    return f"R{position + 1}"


def judge_messages(
    rubric: Rubric, prompt: str, shown: list[str], *, reference: str = "", relative: bool = False
) -> list[dict[str, str]]:
    """Messages asking for ``{"scores": [{"id", "criteria", "explanation"}]}`` for ``shown`` in order."""
    criteria = "\n".join(f"- {c.name}: {c.description}" for c in rubric.criteria)
    parts = [f"Rubric ({rubric.name} v{rubric.version}): {rubric.description}\nCriteria:\n{criteria}"]
    parts.append(f"<prompt>\n{prompt}\n</prompt>")
    if reference:
        parts.append(f"<reference_answer>\n{reference}\n</reference_answer>")
    for i, text in enumerate(shown):
        parts.append(f'<response id="{label(i)}">\n{text}\n</response>')
    example = {
        "scores": [
            {
                "id": label(0),
                "criteria": {c.name: int(SCALE // 2) for c in rubric.criteria},
                "explanation": "one sentence",
            }
        ]
    }
    how = (
        "Score the responses relative to each other: the best one high, the worst low."
        if relative
        else "Score each response on an absolute scale."
    )
    parts.append(
        f"{how} For every response id ({', '.join(label(i) for i in range(len(shown)))}) give each "
        f"criterion an integer from 0 (very poor) to {SCALE:g} (excellent).\n"
        f"Answer with JSON of this shape and nothing else:\n{json.dumps(example)}"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
