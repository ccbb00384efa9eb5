"""Text metrics shared by the evaluator (exact_match and similarity metrics), the reward
judge (its reference-based fallback) and the trainer (verifiable rewards): one definition of
what "the same answer" means across the loop.

Two normalisations:

- :func:`normalise` (the default): case-folded, whitespace collapsed, surrounding punctuation
  stripped. "Paris." and " paris" match; "The Paris" and "Paris" do not.
- :func:`squad_normalise` (``squad=True``): SQuAD's answer normalisation, lower-cased with every
  punctuation mark and the articles a/an/the removed. "The U.S.A." and "usa" match.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_WORD = re.compile(r"\w+", re.UNICODE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalise(text: str) -> str:
    """Case-folded, whitespace collapsed, surrounding punctuation stripped."""
    return " ".join(text.casefold().split()).strip(string.punctuation + " ")


def squad_normalise(text: str) -> str:
    """Lower-cased, no punctuation, no articles, single spaces (SQuAD-style)."""
    text = _ARTICLES.sub(" ", text.lower().translate(_NO_PUNCTUATION))
    return " ".join(text.split())


def words(text: str, *, squad: bool = False) -> list[str]:
    """The word tokens of ``text`` (``\\w+``), case-folded; with ``squad`` after SQuAD's normalisation."""
    return _WORD.findall(squad_normalise(text) if squad else text.casefold())


def exact_match(output: str, expected: str, *, squad: bool = False) -> float:
    """1.0 when ``output`` and ``expected`` are equal after normalisation, else 0.0."""
    norm = squad_normalise if squad else normalise
    return 1.0 if norm(output) == norm(expected) else 0.0


def token_f1(output: str, expected: str, *, squad: bool = False) -> float:
    """SQuAD-style token F1 (bag of words) between the output and the expected answer; two
    texts without words are equal (1.0), one without words matches nothing (0.0)."""
    got = words(output, squad=squad)
    want = words(expected, squad=squad)
    if not got or not want:
        return float(got == want)
    common = sum((Counter(got) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)
