"""Request checks shared by Score, Rank and Compare: each failure says what to fix.

What every service refuses (NUL bytes, lone surrogates) comes from
:mod:`flywheel.core.validation`; the judge adds its own length limit and emptiness rule."""

from __future__ import annotations

import math

from flywheel.core.errors import InvalidArgument
from flywheel.core.validation import check_string


def check_text(field: str, value: str, *, max_chars: int, required: bool = True) -> None:
    """A text the judge reads: present when ``required``, at most ``max_chars``, storable
    (it is hashed into the cache key and sent to models, so no NUL or lone surrogate)."""
    if required and not value.strip():
        raise InvalidArgument(f"{field} is empty; send the text to judge")
    if len(value) > max_chars:
        raise InvalidArgument(
            f"{field} is {len(value):,} characters; the judge takes at most {max_chars:,} "
            "(FLYWHEEL_REWARD_JUDGE_MAX_TEXT_CHARS); truncate or summarise it first"
        )
    check_string(value, field)


def check_group(responses: list[str], *, max_size: int, max_chars: int) -> None:
    if len(responses) < 2:
        raise InvalidArgument(
            f"Rank needs a group of at least 2 responses to the same prompt, got {len(responses)}; "
            "use Score for a single response"
        )
    if len(responses) > max_size:
        raise InvalidArgument(
            f"Rank takes at most {max_size} responses per group (FLYWHEEL_REWARD_JUDGE_MAX_GROUP_SIZE), "
            f"got {len(responses)}; split the group"
        )
    for i, r in enumerate(responses):
        check_text(f"responses[{i}]", r, max_chars=max_chars)


def check_human_score(value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidArgument(f"human_score must be in [0, 1], got {value}")
