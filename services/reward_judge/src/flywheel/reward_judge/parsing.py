"""Strict parsing of the judge's JSON answer, with a bounded repair step.

The judge is asked for ``{"scores": [{"id": "R1", "criteria": {"<name>": 0-10, ...},
"explanation": "..."}]}``. :func:`extract_json` takes the first JSON object out of the
text, repairing what small models commonly get wrong (code fences, prose around it,
trailing commas, Python literals, single quotes, a cut-off end). :func:`read_scores` then
checks the shape strictly: every id asked for, every criterion, numbers in range. Anything
it cannot trust raises :class:`MalformedAnswer`, and the judge asks again.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

SCALE = 10.0  # the judge scores 0-10; we report [0, 1]

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)(?:```|$)", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


class MalformedAnswer(ValueError):
    """The judge's answer is not a usable judgement; the message says why."""


@dataclass(frozen=True)
class Parsed:
    data: Any
    repaired: bool


def _close_truncated(text: str) -> str:
    """Close an answer cut off mid-way: an open string, dangling ``,``/``key:``, open brackets."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if in_string:
        text += '"'
    text = text.rstrip()
    # Drop what cannot be completed: a trailing comma, a key without its value, a bare "."
    for _ in range(3):
        before = text
        text = re.sub(r',\s*"[^"]*"\s*:?\s*$', "", text)  # , "key":  or  , "key"
        text = re.sub(r'([{,])\s*"[^"]*"\s*:\s*$', r"\1", text)
        text = re.sub(r"[,:]\s*$", "", text)
        text = re.sub(r"(\d)\.$", r"\1", text)
        text = text.rstrip()
        if text == before:
            break
    return text + "".join(reversed(stack))


def _repair(text: str) -> str:
    for bad, good in (("\u201c", '"'), ("\u201d", '"'), ("\u2018", "'"), ("\u2019", "'")):
        text = text.replace(bad, good)
    for py, js in _PY_LITERALS.items():
        text = re.sub(rf"(?<![\w\"]){py}(?![\w\"])", js, text)
    if '"' not in text and "'" in text:
        text = text.replace("'", '"')
    text = _TRAILING_COMMA.sub(r"\1", text)
    text = _close_truncated(text)
    return _TRAILING_COMMA.sub(r"\1", text)


def extract_json(text: str) -> Parsed:
    """The first JSON object in ``text``: as is when it parses, else repaired."""
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start = body.find("{")
    if start < 0:
        raise MalformedAnswer(f"no JSON object in the answer: {text[:120]!r}")
    body = body[start:]
    try:
        data, _ = json.JSONDecoder().raw_decode(body)
        return Parsed(data, repaired=fenced is not None or start > 0)
    except json.JSONDecodeError:
        pass
    try:
        data, _ = json.JSONDecoder().raw_decode(_repair(body))
    except json.JSONDecodeError as exc:
        raise MalformedAnswer(f"JSON does not parse even after repair ({exc.msg} at {exc.pos})") from None
    return Parsed(data, repaired=True)


@dataclass(frozen=True)
class ItemScore:
    """One response's judgement: criteria in [0, 1] and the judge's explanation."""

    criteria: dict[str, float]
    explanation: str


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise MalformedAnswer(f"{where} is a boolean, not a score")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MalformedAnswer(f"{where} is {value!r}, not a number") from None
    if not math.isfinite(x) or not 0.0 <= x <= SCALE:
        raise MalformedAnswer(f"{where} is {x}, outside 0-{SCALE:g}")
    return x / SCALE


def read_scores(data: Any, *, ids: list[str], criteria: list[str]) -> dict[str, ItemScore]:
    """Check the answer's shape strictly and return each id's scores.

    Every id must be scored once. Each item carries either all the rubric's criteria or,
    from judges that ignore them, one overall ``score`` (kept as the component "overall")."""
    if not isinstance(data, dict) or not isinstance(data.get("scores"), list):
        raise MalformedAnswer('the answer has no "scores" list')
    found: dict[str, ItemScore] = {}
    for item in data["scores"]:
        if not isinstance(item, dict):
            raise MalformedAnswer("an entry of scores is not an object")
        rid = str(item.get("id", item.get("trajectory_id", ""))).strip()
        if rid not in ids:
            raise MalformedAnswer(f"scores has an unknown id {rid!r}; expected {ids}")
        if rid in found:
            raise MalformedAnswer(f"id {rid!r} is scored twice")
        given = item.get("criteria")
        if isinstance(given, dict) and given:
            missing = [c for c in criteria if c not in given]
            if missing:
                raise MalformedAnswer(f"{rid}: criteria {missing} are missing")
            scores = {c: _number(given[c], f"{rid}.{c}") for c in criteria}
        elif "score" in item:
            scores = {"overall": _number(item["score"], f"{rid}.score")}
        else:
            raise MalformedAnswer(f"{rid}: neither criteria nor score")
        found[rid] = ItemScore(scores, str(item.get("explanation", ""))[:2000])
    missing_ids = [i for i in ids if i not in found]
    if missing_ids:
        raise MalformedAnswer(f"ids {missing_ids} are not scored")
    return found
