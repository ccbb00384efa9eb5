"""Quality filters: minimum response length and near-duplicates by MinHash over word
shingles (no index structure: SAO rounds are thousands of texts, a linear scan of
signatures is fast enough and exact in its estimate's terms)."""

from __future__ import annotations

import hashlib
import random
import re

_MERSENNE = (1 << 61) - 1
_WORD = re.compile(r"\w+", re.UNICODE)


def text_key(text: str) -> str:
    """Texts that differ only in case, whitespace or punctuation have the same key."""
    return " ".join(_WORD.findall(text.lower()))


def shingles(text: str, words: int = 3) -> set[str]:
    tokens = _WORD.findall(text.lower())
    if len(tokens) <= words:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i : i + words]) for i in range(len(tokens) - words + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class MinHasher:
    """Signatures of ``permutations`` universal hash functions (a·x + b mod 2^61-1) over the
    64-bit digests of a text's shingles; the fraction of equal slots estimates Jaccard."""

    def __init__(self, permutations: int = 128, *, shingle_words: int = 3, seed: int = 1) -> None:
        rng = random.Random(seed)  # noqa: S311 - hash parameters, not secrets
        self._ab = [(rng.randrange(1, _MERSENNE), rng.randrange(0, _MERSENNE)) for _ in range(permutations)]
        self.shingle_words = shingle_words

    def signature(self, text: str) -> tuple[int, ...]:
        xs = [
            int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")
            for s in shingles(text, self.shingle_words)
        ] or [0]
        return tuple(min((a * x + b) % _MERSENNE for x in xs) for a, b in self._ab)

    @staticmethod
    def similarity(s1: tuple[int, ...], s2: tuple[int, ...]) -> float:
        return sum(1 for x, y in zip(s1, s2, strict=True) if x == y) / len(s1)


class NearDuplicateIndex:
    """Texts kept so far; ``add_if_new`` refuses one whose estimated Jaccard with a kept text
    is at or above ``threshold`` (or whose :func:`text_key` is a kept one's)."""

    def __init__(self, threshold: float, *, permutations: int = 128, shingle_words: int = 3) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"similarity_threshold {threshold}: must be in (0, 1]")
        self.threshold = threshold
        self._hasher = MinHasher(permutations, shingle_words=shingle_words)
        self._keys: set[str] = set()
        self._signatures: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return len(self._signatures)

    def is_duplicate(self, text: str) -> bool:
        if text_key(text) in self._keys:
            return True
        sig = self._hasher.signature(text)
        return any(MinHasher.similarity(sig, s) >= self.threshold for s in self._signatures)

    def add_if_new(self, text: str) -> bool:
        if self.is_duplicate(text):
            return False
        self._keys.add(text_key(text))
        self._signatures.append(self._hasher.signature(text))
        return True

    def similarity(self, a: str, b: str) -> float:
        return MinHasher.similarity(self._hasher.signature(a), self._hasher.signature(b))


def too_short(a: str, b: str, min_length: int) -> bool:
    return len(a.strip()) < min_length or len(b.strip()) < min_length
