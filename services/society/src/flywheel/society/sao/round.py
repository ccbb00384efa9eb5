"""One SAO round, and iterative rounds.

A round: personas -> prompts (one each, plus any real trace prompts mixed in) -> drop repeated
prompts -> two responses each -> length and near-identical filters -> the model's own
ranking -> the reward judge in both orders -> records. Every pair that does not make it is
counted under one reason, so the stats say what each filter and each kind of failure cost.

Drop reasons: ``prompt_llm_timeout``/``prompt_llm_error``/``prompt_llm_empty`` (writing the
prompt), ``response_llm_timeout``/``response_llm_error``/``response_llm_empty``,
``duplicate_prompt`` (near-duplicate of a prompt in this round or the existing dataset),
``too_short``, ``identical_responses``, ``ranking_llm_timeout``/``ranking_llm_error``/
``ranking_llm_empty``/``ranking_llm_rejected_response_format``, ``unparsable_ranking``,
``judge_unavailable``, ``judge_tie``,
``judge_order_disagreement`` (the two orders pick different winners) and
``self_judge_disagreement`` (both orders agree, against the model's own ranking)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.dataset import SaoDataset, SaoRecord
from flywheel.society.sao.diversity import measure
from flywheel.society.sao.filters import NearDuplicateIndex, too_short
from flywheel.society.sao.generate import respond, write_prompt
from flywheel.society.sao.judge import judge_both_orders, self_rank
from flywheel.society.sao.llm import Llm, Ranker
from flywheel.society.sao.personas import Persona, generate_personas


@dataclass
class RoundStats:
    """What a round made and what it dropped, and why."""

    iteration: int
    personas: int = 0  # prompts asked for: one per persona (plus ``trace_prompts``)
    personas_from_model: int = 0  # the rest fell back to their attribute sentence
    prompts_generated: int = 0  # prompts written (persona prompts that came back + trace prompts)
    trace_prompts: int = 0
    unique_prompts: int = 0
    prompt_repetition_rate: float = 0.0  # the paper's diversity figure, over the prompts written
    prompt_near_duplicate_rate: float = 0.0
    prompt_distinct_2: float = 0.0
    pairs_generated: int = 0  # prompts with two responses
    self_ranked: int = 0  # pairs the model ranked parseably
    judged: int = 0  # pairs the reward judge ranked in both orders
    judge_order_agreement_rate: float = float("nan")  # of judged pairs, both orders named the same winner
    self_judge_agreement_rate: float = float("nan")  # of order-consistent pairs, the judge agreed with the model
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def attempted(self) -> int:
        """Everything that entered the round: persona prompts asked for and trace prompts.
        ``kept + dropped_total == attempted``."""
        return self.personas + self.trace_prompts

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def dropped_fraction(self, reason: str) -> float:
        """The share of :attr:`attempted` dropped for ``reason``."""
        return self.dropped.get(reason, 0) / self.attempted if self.attempted else 0.0

    def to_dict(self) -> dict[str, Any]:
        fractions = {k: self.dropped_fraction(k) for k in self.dropped}
        return {
            **asdict(self),
            "attempted": self.attempted,
            "dropped_total": self.dropped_total,
            "dropped_fraction": fractions,
        }


@dataclass
class RoundResult:
    records: list[SaoRecord]
    stats: RoundStats
    personas: list[Persona]
    prompts: list[str]  # every prompt written, before the duplicate filter


@dataclass
class _Item:
    prompt: str
    persona: str
    a: str = ""
    b: str = ""


def _now() -> str:
    return datetime.now(UTC).isoformat()


async def run_round(
    config: SaoConfig,
    *,
    llm: Llm,
    judge: Ranker,
    iteration: int = 1,
    existing: SaoDataset | None = None,
    trace_prompts: Sequence[str] = (),
    clock: Callable[[], str] = _now,
) -> RoundResult:
    """Run one SAO round with the policy model ``llm`` and the reward judge ``judge``.

    ``existing`` records (earlier rounds, imports) count as already-seen prompts for the
    duplicate filter; ``trace_prompts`` (real prompts of an endpoint) are mixed in beside the
    persona prompts. Never raises for the model's or the judge's failures: they are counted
    in ``RoundResult.stats.dropped``."""
    started = asyncio.get_running_loop().time()
    stats = RoundStats(iteration=iteration)
    dropped: Counter[str] = Counter()
    gate = asyncio.Semaphore(config.batch_size)

    async def bounded(make: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await make()

    personas = await generate_personas(llm, config, round_index=iteration - 1)
    stats.personas = len(personas)
    stats.personas_from_model = sum(p.from_model for p in personas)

    # Prompts: one per persona, then the trace prompts.
    answers = await asyncio.gather(*(bounded(lambda p=p: write_prompt(llm, p.description, config)) for p in personas))
    written: list[_Item] = []
    for persona, got in zip(personas, answers, strict=True):
        if got.failure:
            dropped[f"prompt_{got.failure}"] += 1
        else:
            written.append(_Item(got.text, persona.description))
    written += [_Item(p.strip(), "") for p in trace_prompts if p.strip()]
    stats.trace_prompts = sum(1 for p in trace_prompts if p.strip())
    prompts = [w.prompt for w in written]
    stats.prompts_generated = len(prompts)
    div = measure(prompts, similarity_threshold=config.similarity_threshold, permutations=config.minhash_permutations)
    stats.unique_prompts = div.unique_prompts
    stats.prompt_repetition_rate = div.repetition_rate
    stats.prompt_near_duplicate_rate = div.near_duplicate_rate
    stats.prompt_distinct_2 = div.distinct_2

    # Repeated prompts go before any response is paid for (in a fixed order: reproducible).
    seen = NearDuplicateIndex(
        config.similarity_threshold, permutations=config.minhash_permutations, shingle_words=config.shingle_words
    )
    for p in existing.prompts() if existing else ():
        seen.add_if_new(p)
    items = []
    for w in written:
        if seen.add_if_new(w.prompt) or not config.quality_filter:
            items.append(w)
        else:
            dropped["duplicate_prompt"] += 1

    # Two responses per prompt, from the same model at the same temperature.
    async def two(item: _Item) -> _Item | str:
        a, b = await asyncio.gather(
            bounded(lambda: respond(llm, item.prompt, config)), bounded(lambda: respond(llm, item.prompt, config))
        )
        for got in (a, b):
            if got.failure:
                return f"response_{got.failure}"
        item.a, item.b = a.text, b.text
        return item

    paired: list[_Item] = []
    for got in await asyncio.gather(*(two(i) for i in items)):
        if isinstance(got, str):
            dropped[got] += 1
        else:
            paired.append(got)
    stats.pairs_generated = len(paired)

    filtered: list[_Item] = []
    for item in paired:
        if item.a.strip() == item.b.strip():
            dropped["identical_responses"] += 1
        elif config.quality_filter and too_short(item.a, item.b, config.min_response_length):
            dropped["too_short"] += 1
        elif config.quality_filter and seen.similarity(item.a, item.b) >= config.similarity_threshold:
            dropped["identical_responses"] += 1  # near-identical: no preference to learn
        else:
            filtered.append(item)

    # The model's own ranking, then the reward judge in both orders.
    async def judge_one(item: _Item) -> SaoRecord | str:
        mine = await bounded(lambda: self_rank(llm, item.prompt, item.a, item.b, config))
        if mine.winner is None:
            return mine.failure if mine.failure == "unparsable_ranking" else f"ranking_{mine.failure}"
        verdict = await bounded(lambda: judge_both_orders(judge, item.prompt, item.a, item.b, config))
        if verdict.failure:
            return "self_ranked:" + verdict.failure
        if not verdict.agreed:
            both_tied = verdict.forward_winner is None and verdict.swapped_winner is None
            return "self_ranked:judged:" + ("judge_tie" if both_tied else "judge_order_disagreement")
        if config.require_self_agreement and verdict.winner != mine.winner:
            return "self_ranked:judged:agreed:self_judge_disagreement"
        chosen, rejected = (item.a, item.b) if mine.winner == "A" else (item.b, item.a)
        other = "B" if mine.winner == "A" else "A"
        return SaoRecord(
            prompt=item.prompt,
            chosen=chosen,
            rejected=rejected,
            iteration=iteration,
            timestamp=clock(),
            persona=item.persona,
            chosen_score=verdict.mean(mine.winner),
            rejected_score=verdict.mean(other),
        )

    records: list[SaoRecord] = []
    agreed = self_agreed = 0
    for got in await asyncio.gather(*(judge_one(i) for i in filtered)):
        if isinstance(got, SaoRecord):
            records.append(got)
            stats.self_ranked += 1
            stats.judged += 1
            agreed += 1
            self_agreed += 1
            continue
        # The prefixes say how far the pair got, for the agreement rates.
        *reached, reason = got.split(":")
        stats.self_ranked += "self_ranked" in reached
        stats.judged += "judged" in reached
        agreed += "agreed" in reached
        dropped[reason] += 1
    if stats.judged:
        stats.judge_order_agreement_rate = agreed / stats.judged
    if agreed:
        stats.self_judge_agreement_rate = self_agreed / agreed
    stats.kept = len(records)
    stats.dropped = dict(sorted(dropped.items()))
    stats.seconds = asyncio.get_running_loop().time() - started
    return RoundResult(records, stats, personas, prompts)


async def run_rounds(
    config: SaoConfig,
    *,
    llm: Llm | Callable[[int], Llm],
    judge: Ranker,
    dataset: SaoDataset | None = None,
    trace_prompts: Sequence[str] = (),
    on_round: Callable[[RoundResult], Awaitable[None]] | None = None,
) -> tuple[SaoDataset, list[RoundStats]]:
    """``config.iterative_rounds`` rounds, each with fresh personas and its records added to
    ``dataset`` (so later rounds skip prompts already kept). ``llm`` may be a function of the
    iteration number, giving the policy trained on the earlier rounds (the paper's iterative
    SAO); ``on_round`` sees each round's result (to publish it, or train on it) before the next."""
    dataset = dataset if dataset is not None else SaoDataset()
    all_stats = []
    for iteration in range(1, config.iterative_rounds + 1):
        model = llm(iteration) if callable(llm) and not hasattr(llm, "complete") else llm
        result = await run_round(
            config,
            llm=model,  # type: ignore[arg-type]
            judge=judge,
            iteration=iteration,
            existing=dataset,
            trace_prompts=trace_prompts if iteration == 1 else (),
        )
        dataset.extend(result.records)
        all_stats.append(result.stats)
        if on_round is not None:
            await on_round(result)
    return dataset, all_stats
