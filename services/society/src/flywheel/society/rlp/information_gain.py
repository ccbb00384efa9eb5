"""RLP's reward for a thought: its information gain about the observed outcome.

    r(thought) = log p(x | context, thought) - log p_baseline(x | context)

where x is the outcome written as text (``render_outcome``). Both terms are sums of token
log-probabilities of x's tokens only, read from a model server's ``/v1/completions`` with
``echo: true, logprobs: 0, max_tokens: 0`` (OpenAI's legacy shape, which the local model server
and vLLM give): the whole text is scored, and the outcome's tokens are those at or after the
prefix's end by ``text_offset``. (Counting the tokens of the prefix alone would be wrong: SmolLM2
tokenises a prefix ending in a blank line with one blank-line token, which the whole text splits.)

The baseline is the adapter-free base model given the context alone (the paper's EMA teacher,
tau = ``ema_decay``, is not built yet); while the reasoning policy is still the base model,
this is exactly "the same model without the thought".

Where the provider gives no log-probabilities, ``prediction_gain`` scores the thought's stated
numeric predictions against the observed scores (Gaussian log-likelihood with the stated or a
default sigma, minus that of a no-think baseline prediction when one is given). Every result
names the definition used."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

LOGPROBS = "logprob_information_gain"
PREDICTION_GAIN = "prediction_information_gain"
PREDICTION_LOGLIK = "prediction_log_likelihood"
Definition = Literal["logprob_information_gain", "prediction_information_gain", "prediction_log_likelihood"]


class ScoringError(Exception):
    """The reward could not be computed (bad input, a server error, a timeout); the message says why."""


class LogprobsUnavailable(ScoringError):
    """The provider gives no prompt log-probabilities (no /completions, no echo or logprobs)."""


@dataclass(frozen=True)
class OutcomeScore:
    """log p(outcome | prefix) under one model: the sum over the outcome's tokens."""

    logprob: float
    tokens: list[str]
    token_logprobs: list[float]
    straddled: bool  # a token spanned the prefix's end; it was counted with the outcome


@dataclass(frozen=True)
class InformationGain:
    """One thought's reward and how it was obtained."""

    reward: float
    definition: Definition
    baseline: str  # what the thought was compared against, in words
    with_thought: float | None = None  # log-likelihood of the outcome given the thought
    without_thought: float | None = None
    outcome_tokens: int = 0
    notes: list[str] = field(default_factory=list)


def render_outcome(scores: Mapping[str, float], *, metric: str = "score") -> str:
    """The observed outcome as the text whose likelihood is measured: one line per config,
    in the order given (the same text for every thought of a group)."""
    if not scores:
        raise ScoringError("outcome: no observed scores to write down")
    lines = ["Observed outcome:"]
    for key, value in scores.items():
        if not math.isfinite(value):
            raise ScoringError(f"outcome: the score of {key} is not finite ({value})")
        lines.append(f"- {key}: {metric} {value:.3f}")
    return "\n".join(lines) + "\n"


def with_thought_prefix(context: str, thought: str) -> str:
    """The text before the outcome when the model has thought (ends with a blank line, so the
    outcome's first token starts exactly at the boundary)."""
    return f"{context.rstrip()}\n\nThought: {thought.strip()}\n\n"


def without_thought_prefix(context: str) -> str:
    return f"{context.rstrip()}\n\n"


class LogprobScorer:
    """Scores texts on an OpenAI-compatible server's ``/v1/completions`` (``api_base`` ends in
    ``/v1``, as LiteLLM's). Usable as an async context manager."""

    def __init__(
        self,
        api_base: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._url = api_base.rstrip("/") + "/completions"
        self._headers = headers

    async def __aenter__(self) -> LogprobScorer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()

    async def outcome_logprob(self, model: str, prefix: str, outcome: str) -> OutcomeScore:
        """log p(outcome | prefix) under ``model``: the text prefix + outcome is scored in one
        request and the log-probabilities of the outcome's tokens summed."""
        if not outcome:
            raise ScoringError("outcome: empty text")
        body = {"model": model, "prompt": prefix + outcome, "echo": True, "logprobs": 0, "max_tokens": 0}
        try:
            resp = await self._client.post(self._url, json=body, headers=self._headers)
        except httpx.TimeoutException:
            raise ScoringError(f"{self._url}: no answer in time scoring with {model!r}") from None
        except httpx.HTTPError as exc:
            raise ScoringError(f"{self._url}: {type(exc).__name__}: {exc}") from None
        said = _error_text(resp)
        if resp.status_code in (404, 405, 501) or (
            resp.status_code == 400 and any(w in said.lower() for w in ("logprob", "echo"))
        ):
            raise LogprobsUnavailable(f"{self._url} answered {resp.status_code}: {said}")
        if resp.status_code != 200:
            raise ScoringError(f"{self._url} answered {resp.status_code}: {said}")
        try:
            logprobs = resp.json()["choices"][0]["logprobs"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ScoringError(f"{self._url}: not a completions answer: {resp.text[:200]!r}") from None
        return outcome_slice(logprobs, len(prefix), self._url)


def outcome_slice(logprobs: Any, boundary: int, where: str = "answer") -> OutcomeScore:
    """The outcome's share of an echoed ``logprobs`` object: tokens whose ``text_offset`` is at
    or after ``boundary`` (characters), plus one that straddles it."""
    if not isinstance(logprobs, dict) or not all(k in logprobs for k in ("tokens", "token_logprobs", "text_offset")):
        raise LogprobsUnavailable(f"{where}: the answer carries no echoed log-probabilities")
    tokens, values, offsets = logprobs["tokens"], logprobs["token_logprobs"], logprobs["text_offset"]
    if not (len(tokens) == len(values) == len(offsets)):
        raise ScoringError(f"{where}: tokens, token_logprobs and text_offset differ in length")
    picked = [i for i in range(len(tokens)) if offsets[i] >= boundary]
    first = picked[0] if picked else len(tokens)
    straddled = first > 0 and offsets[first - 1] + len(tokens[first - 1]) > boundary
    if straddled:
        picked.insert(0, first - 1)
    if not picked:
        raise ScoringError(f"{where}: no token of the outcome was scored (the text was cut?)")
    chosen = [values[i] for i in picked]
    if any(v is None or not math.isfinite(v) for v in chosen):
        # The very first token of a text has no log-probability: the prefix was empty.
        raise ScoringError(f"{where}: an outcome token has no finite log-probability; give a non-empty context")
    return OutcomeScore(float(sum(chosen)), [tokens[i] for i in picked], [float(v) for v in chosen], straddled)


async def information_gain(
    scorer: LogprobScorer, *, model: str, baseline_model: str, context: str, thought: str, outcome: str
) -> InformationGain:
    """log p(outcome | context, thought) under ``model`` minus log p(outcome | context) under
    ``baseline_model`` (the adapter-free base). Raises LogprobsUnavailable or ScoringError."""
    if not context.strip():
        raise ScoringError("context: empty")
    if not thought.strip():
        raise ScoringError("thought: empty")
    thinking, plain = await asyncio.gather(
        scorer.outcome_logprob(model, with_thought_prefix(context, thought), outcome),
        scorer.outcome_logprob(baseline_model, without_thought_prefix(context), outcome),
    )
    notes = []
    if thinking.tokens != plain.tokens:
        notes.append(f"the outcome was tokenised differently ({len(thinking.tokens)} vs {len(plain.tokens)} tokens)")
    if thinking.straddled or plain.straddled:
        notes.append("a token spanned the boundary between prefix and outcome")
    return InformationGain(
        reward=thinking.logprob - plain.logprob,
        definition=LOGPROBS,
        baseline=f"no-think baseline: adapter-free base model {baseline_model!r} given the context alone",
        with_thought=thinking.logprob,
        without_thought=plain.logprob,
        outcome_tokens=len(thinking.tokens),
        notes=notes,
    )


def gaussian_loglik(y: float, mean: float, sigma: float) -> float:
    return -0.5 * math.log(2 * math.pi * sigma * sigma) - (y - mean) ** 2 / (2 * sigma * sigma)


def prediction_gain(
    predicted: Mapping[str, float],
    observed: Mapping[str, float],
    *,
    sigmas: Mapping[str, float | None] | None = None,
    default_sigma: float = 0.1,
    baseline_mean: float | None = None,
    baseline_sigma: float | None = None,
    min_sigma: float = 1e-3,
) -> InformationGain:
    """The fallback reward: sum_k log N(y_k; mu_k, sigma_k) over configs k both predicted and observed
    (sigma_k stated, else ``default_sigma``), minus sum_k log N(y_k; baseline_mean, baseline_sigma)
    when a no-think baseline prediction is given (e.g. the mean score so far). ScoringError
    when no config was both predicted and observed."""
    common = [k for k in predicted if k in observed]
    if not common:
        raise ScoringError(
            f"no observed config was predicted (predicted {sorted(predicted)[:5]}, observed {sorted(observed)[:5]})"
        )
    sigmas = sigmas or {}
    notes = []
    with_thought = 0.0
    for key in common:
        stated = sigmas.get(key)
        sigma = default_sigma if stated is None or not math.isfinite(stated) or stated <= 0 else stated
        if sigma < min_sigma:
            notes.append(f"sigma of {key} raised from {sigma} to {min_sigma}")
            sigma = min_sigma
        with_thought += gaussian_loglik(observed[key], predicted[key], sigma)
    if len(common) < len(predicted):
        notes.append(f"{len(predicted) - len(common)} predicted config(s) were not observed")
    if baseline_mean is None:
        return InformationGain(
            with_thought,
            PREDICTION_LOGLIK,
            "none: log-likelihood of the observed scores under the stated predictions",
            with_thought=with_thought,
            outcome_tokens=0,
            notes=notes,
        )
    base_sigma = max(baseline_sigma or default_sigma, min_sigma)
    without = sum(gaussian_loglik(observed[k], baseline_mean, base_sigma) for k in common)
    return InformationGain(
        with_thought - without,
        PREDICTION_GAIN,
        f"no-think prediction N({baseline_mean:.3f}, {base_sigma:.3f}) for every config",
        with_thought=with_thought,
        without_thought=without,
        notes=notes,
    )


def _error_text(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


def config_key(params: Mapping[str, Any]) -> str:
    """A config's name in outcomes and predictions: its parameters as sorted, compact JSON."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)
