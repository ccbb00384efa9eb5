"""The verifiable task: name a country's capital with the city alone.

A prompt is one question per country; prompts are split into training and held-out sets by
country, seeded, before anything is sampled or trained. An answer is correct when, after
normalisation (lowercase, no punctuation, no articles, no accents), it *is* one of the
accepted names: "Paris" and "Paris." are right, "The capital of France is Paris." is not.
The lenient check (the accepted name appears as whole words anywhere in the answer) is
reported beside it, to tell format from knowledge.
"""

from __future__ import annotations

import random
import re
import string
import unicodedata
from dataclasses import dataclass

from countries import CAPITALS

QUESTION = "What is the capital of {country}? Answer with the city alone."


@dataclass(frozen=True)
class Case:
    country: str
    prompt: str
    answers: tuple[str, ...]  # accepted; answers[0] is the judge's reference

    @property
    def reference(self) -> str:
        return self.answers[0]


def cases() -> list[Case]:
    return [Case(c, QUESTION.format(country=c), a) for c, a in CAPITALS.items()]


def few_shot(case: Case, shots: list[Case]) -> list[dict[str, str]]:
    """The same question after worked examples (training countries answered with the city
    alone): the second prompt variant the product samples with."""
    messages = []
    for shot in shots:
        messages += [{"role": "user", "content": shot.prompt}, {"role": "assistant", "content": shot.reference}]
    return [*messages, {"role": "user", "content": case.prompt}]


def split(all_cases: list[Case], *, held_out_fraction: float, seed: int) -> tuple[list[Case], list[Case]]:
    """Train and held-out cases, disjoint by country, chosen by a seeded shuffle."""
    if not 0 < held_out_fraction < 1:
        raise ValueError("held_out_fraction: must be in (0, 1)")
    order = sorted(all_cases, key=lambda c: c.country)
    random.Random(seed).shuffle(order)
    n_held = round(held_out_fraction * len(order))
    return order[n_held:], order[:n_held]


def normalize(text: str) -> str:
    """Lowercase, accents folded, punctuation dropped, articles dropped, single spaces."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = text.translate(str.maketrans(string.punctuation, " " * len(string.punctuation)))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact(answer: str, case: Case) -> bool:
    """The city alone: the normalised answer equals an accepted name."""
    got = normalize(answer)
    return any(got == normalize(a) for a in case.answers)


def mentions(answer: str, case: Case) -> bool:
    """Lenient: an accepted name appears as whole words anywhere in the answer."""
    got = f" {normalize(answer)} "
    return any(f" {normalize(a)} " in got for a in case.answers)
