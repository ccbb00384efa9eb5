"""Test-case augmentation: variants of a few hand-written test cases (The Convergence's
``evaluation.test_cases.augmentation``, with its names and defaults).

    augmentation:
      enabled: true
      mutation_rate: 0.3        # chance to change each word that can change
      crossover_rate: 0.2       # chance that a variant blends two cases
      augmentation_factor: 2    # variants per original
      preserve_originals: true  # keep the originals in the set
      seed: 0                   # the same config always gives the same cases

Mutations: synonym replacement, added emphasis ("Please ...", "... carefully."), number
scaling (0.5x to 2x, integers stay integers), and crossover (the first sentences of one
case with the last sentences of another).

Labels are kept true. The Convergence scaled the numbers of "What is 5+3?" and kept
"expected: 8", and blended prompts while averaging their expected values, so its variants
were graded against wrong answers. Here a case with an ``expected`` value gets only the
wording changes that keep its answer (synonyms, emphasis); numbers and crossover touch only
cases without one (scored by a judge, latency or cost).

Augmentation is a pure function of the cases and the settings (seeded), so every replica
and a restarted optimizer see the same test cases for a run.
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Word -> interchangeable words, for instructions and questions (lowercase).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "calculate": ("compute", "determine", "work out"),
    "compute": ("calculate", "determine"),
    "determine": ("find", "work out", "figure out"),
    "find": ("determine", "identify"),
    "solve": ("work out", "figure out"),
    "explain": ("describe", "clarify"),
    "describe": ("explain", "outline"),
    "give": ("provide", "offer"),
    "provide": ("give", "supply"),
    "show": ("present", "display"),
    "write": ("compose", "draft"),
    "summarize": ("sum up", "condense"),
    "summarise": ("sum up", "condense"),
    "reply": ("answer", "respond"),
    "question": ("query", "problem"),
    "help": ("assist", "support"),
    "use": ("employ", "apply"),
    "make": ("create", "build"),
    "create": ("make", "produce"),
    "check": ("verify", "confirm"),
    "short": ("brief", "concise"),
    "brief": ("short", "concise"),
    "simple": ("plain", "basic"),
    "quick": ("fast", "rapid"),
    "big": ("large", "sizeable"),
    "large": ("big", "sizeable"),
    "small": ("little", "tiny"),
    "total": ("overall", "combined"),
    "cost": ("price", "expense"),
    "price": ("cost",),
    "buy": ("purchase", "get"),
    "need": ("require", "want"),
    "want": ("wish", "need"),
    "important": ("key", "essential"),
    "example": ("instance", "sample"),
    "issue": ("problem", "matter"),
    "problem": ("issue", "question"),
    "error": ("mistake", "fault"),
    "fix": ("repair", "resolve"),
    "start": ("begin", "launch"),
    "stop": ("halt", "end"),
}
EMPHASIS_PREFIXES = ("Please ", "Kindly ")
EMPHASIS_SUFFIXES = (" Be careful.", " Answer clearly.", " Think it through.")
SCALES = (0.5, 0.75, 1.25, 1.5, 2.0)
_WORD = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# Tries per variant before an original is given fewer variants (all came out duplicates).
_ATTEMPTS = 8


class AugmentationConfig(BaseModel):
    """``evaluation.test_cases.augmentation``; off unless ``enabled``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    mutation_rate: float = Field(default=0.3, ge=0, le=1)
    crossover_rate: float = Field(default=0.2, ge=0, le=1)
    augmentation_factor: int = Field(default=2, ge=1, le=10)
    preserve_originals: bool = True
    seed: int = 0


def augment(cases: list[dict[str, Any]], config: AugmentationConfig) -> list[dict[str, Any]]:
    """The test cases after augmentation (each a dict with id, input, expected, metadata).

    Variant ids are ``<original id>~aug<n>``; their metadata names the original
    (``augmented_from``) and the changes made (``augmentation``). A variant identical to a
    case already in the set is drawn again, and dropped after a few tries."""
    if not config.enabled:
        return cases
    rng = random.Random(config.seed)  # noqa: S311 - reproducible variants, not secrets
    seen = {_key(c) for c in cases}
    unlabelled = [c for c in cases if c.get("expected") is None]
    out: list[dict[str, Any]] = list(cases) if config.preserve_originals else []
    for case in cases:
        made = 0
        for n in range(1, config.augmentation_factor + 1):
            for _ in range(_ATTEMPTS):
                variant = _variant(case, unlabelled, config, rng)
                if variant is not None and _key(variant) not in seen:
                    break
            else:
                continue
            seen.add(_key(variant))
            variant["id"] = f"{case['id']}~aug{n}"
            out.append(variant)
            made += 1
        if not made and not config.preserve_originals:
            out.append(case)  # a case with nothing to vary is kept rather than lost
    return out


def diversity(cases: list[dict[str, Any]]) -> float:
    """Mean pairwise word-set (Jaccard) distance between the cases' inputs: 0 all alike, 1 no
    word shared. The Convergence printed the same kind of score; 0.6-0.8 is a healthy spread."""
    words = [set(_WORD.findall(_text(c.get("input")).lower())) for c in cases]
    pairs = [(a, b) for i, a in enumerate(words) for b in words[i + 1 :]]
    if not pairs:
        return 0.0
    return sum(1 - len(a & b) / max(1, len(a | b)) for a, b in pairs) / len(pairs)


def _variant(
    case: dict[str, Any], unlabelled: list[dict[str, Any]], config: AugmentationConfig, rng: random.Random
) -> dict[str, Any] | None:
    labelled = case.get("expected") is not None
    changes: list[str] = []
    value = case.get("input")
    partners = [c for c in unlabelled if c is not case and isinstance(c.get("input"), type(value))]
    if not labelled and partners and rng.random() < config.crossover_rate:
        blended = _crossover(value, rng.choice(partners).get("input"), rng)
        if blended != value:
            value = blended
            changes.append("crossover")

    def mutate(text: str) -> str:
        text = _synonyms(text, config.mutation_rate, rng, changes)
        if not labelled:
            text = _scale_numbers(text, config.mutation_rate, rng, changes)
        if rng.random() < config.mutation_rate:
            text = _emphasis(text, rng)
            changes.append("emphasis")
        return text

    value = _map_strings(value, mutate)
    if not changes:
        return None
    metadata = {**case.get("metadata", {}), "augmented_from": case["id"], "augmentation": sorted(set(changes))}
    return {"id": case["id"], "input": value, "expected": case.get("expected"), "metadata": metadata}


def _synonyms(text: str, rate: float, rng: random.Random, changes: list[str]) -> str:
    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        options = SYNONYMS.get(word.lower())
        if not options or rng.random() >= rate:
            return word
        changes.append("synonym")
        new = rng.choice(options)
        return new[:1].upper() + new[1:] if word[:1].isupper() else new

    return _WORD.sub(swap, text)


def _scale_numbers(text: str, rate: float, rng: random.Random, changes: list[str]) -> str:
    def scale(match: re.Match[str]) -> str:
        raw = match.group(0)
        if rng.random() >= rate:
            return raw
        factor = rng.choice(SCALES)
        if "." in raw:
            decimals = len(raw.split(".")[1])
            new = f"{float(raw) * factor:.{decimals}f}"
        else:
            new = str(max(1, round(int(raw) * factor)))
        if new != raw:
            changes.append("numbers")
        return new

    return _NUMBER.sub(scale, text)


def _emphasis(text: str, rng: random.Random) -> str:
    if rng.random() < 0.5 and text[:1].isalpha():
        return rng.choice(EMPHASIS_PREFIXES) + text[:1].lower() + text[1:]
    return text.rstrip() + rng.choice(EMPHASIS_SUFFIXES)


def _crossover(a: Any, b: Any, rng: random.Random) -> Any:
    """The first sentences of ``a`` and the last of ``b`` (per string field for mappings)."""
    if isinstance(a, str) and isinstance(b, str):
        left, right = _SENTENCE.split(a.strip()), _SENTENCE.split(b.strip())
        if len(left) < 2 and len(right) < 2:
            return a
        cut_a, cut_b = max(1, len(left) // 2), len(right) // 2
        return " ".join(left[:cut_a] + right[cut_b:])
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _crossover(v, b[k], rng) if k in b else v for k, v in a.items()}
    return a


def _map_strings(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return " ".join(_text(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    return ""


def _key(case: dict[str, Any]) -> str:
    return repr(case.get("input"))
