"""The RLP loop of the society (arXiv 2510.01265 adapted to configuration search).

It follows run progress (the ``society-run-progress`` consumer). For a run whose YAML sets
``society.enabled`` and ``society.learning.rlp_enabled``:

* **Step** - the first time a generation g of the run is seen, the reasoning model reads the
  run's history (the optimizer's ListRunCandidates), its search space and the best-rewarded
  earlier thoughts on that space (few-shot), and writes G >= 2 thoughts, each with configs and
  predicted scores. The best-predicted new configs go to the run as ``ProposalEvent``s (source
  RLP, the thought as rationale); the optimizer races them in generation g. A model that
  answers prose, nothing, or not in time makes a *failed* step with its reason and no
  proposal; the run never waits for the society. With ``FLYWHEEL_SOCIETY_RLP_STRUCTURED_OUTPUT``
  (default on) the request carries the thoughts' JSON schema as ``response_format``
  (``rlp/schema.py``), which the local model server enforces while generating; a provider
  that refuses it fails the step as ``llm_rejected_response_format``.
* **Resolution** - once the run is past g (or finished), each proposal's observed score and
  whether it beat its generation's median are recorded, and each thought whose configs were
  evaluated is rewarded with its information gain about the outcome (log-probabilities from
  the model server, or the stated-prediction fallback; the definition is recorded). Rewards
  give the group advantage A = G/(G-1)(r - mean r), are normalised by the space's running
  normaliser (kept in PostgreSQL), and GAE runs over the run's generations. Each rewarded
  thought is an experience in the space's buffer (at most ``buffer_size``, oldest dropped).
* **Policy** - the buffer drives few-shot examples at once and, past a size, a GRPO job
  (``policy_training``) whose adapter then writes the space's thoughts.

Which model reasons: the run's ``society.llm.model``, else its ``learning.rlp.model_name``
when the run sets one, else ``FLYWHEEL_LLM_MODEL``; it must be one the society allows
(``FLYWHEEL_SOCIETY_MODELS``). Once a space has a trained adapter, its served name replaces
the model (same provider prefix). Log-probabilities are scored on the model's served name
(the part after the provider prefix); the no-think baseline is ``learning.rlp.base_model_name``
or the base model without the adapter.

SAO rounds of runs with ``learning.sao_enabled`` are started here too (every ``sao_every``
generations, through ``start_sao``)."""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from google.protobuf import struct_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import runs_pb2
from flywheel.api.optimizer.v1.events_pb2 import RunProgressEvent
from flywheel.api.society.v1.events_pb2 import PROPOSAL_SOURCE_RLP, ProposalEvent
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.logging import get_logger
from flywheel.society.models import RlpProposalRow, RlpStepRow
from flywheel.society.rlp import buffer
from flywheel.society.rlp.advantages import RewardNormalizer, group_advantages
from flywheel.society.rlp.config import RLPConfig
from flywheel.society.rlp.context import build_context, history_of, params_key, space_fingerprint, space_parameters
from flywheel.society.rlp.information_gain import LogprobScorer, ScoringError, config_key, render_outcome
from flywheel.society.rlp.policy_training import PolicyTraining
from flywheel.society.rlp.propose import SpaceError, choose_proposals
from flywheel.society.rlp.resolution import Resolution, resolve, step_gae, thoughts_from_json, thoughts_to_json
from flywheel.society.rlp.reward import thought_reward
from flywheel.society.rlp.schema import thoughts_response_format
from flywheel.society.rlp.thoughts import ParseResult, ProposedConfig, Thought, parse_thoughts
from flywheel.society.runsettings import RunSociety, RunSocietyError, choose_model, parse_run_society
from flywheel.society.settings import SocietySettings

log = get_logger(__name__)

RUNNING = runs_pb2.RUN_STATE_RUNNING
FINISHED = {runs_pb2.RUN_STATE_SUCCEEDED, runs_pb2.RUN_STATE_FAILED, runs_pb2.RUN_STATE_CANCELLED}
RATIONALE_CHARS = 2000
CONFIG_CACHE = 1024
BAD_CONFIG_GENERATION = -1  # the one failed step recorded for a run whose society block is unusable
REJECTED_FORMAT = "llm_rejected_response_format"


class Thinker(Protocol):
    """The reasoning model: chat messages in, the answer's text out (may raise).
    ``response_format``: OpenAI's, to pass on (None: ask for nothing)."""

    async def __call__(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
    ) -> str: ...


class LlmThinker:
    """The reasoning model through LiteLLM (``FLYWHEEL_LLM_*``: the local model server or any
    provider). ``warm`` imports LiteLLM on a thread at startup (seconds), so the first step of
    the first run is not spent importing while the run's generation goes by."""

    def __init__(self, settings: SocietySettings) -> None:
        self._settings = settings
        self._client: Any = None

    async def warm(self) -> None:
        if self._client is None:
            from flywheel.core.llm import LlmClient, load_litellm

            await load_litellm()
            self._client = LlmClient(self._settings.llm)

    async def __call__(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        await self.warm()
        # drop_params: LiteLLM leaves response_format out for providers it knows lack it; one
        # that still refuses it fails the step as "llm_rejected_response_format".
        got = await self._client.complete(
            messages,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            response_format=response_format,
            drop_params=True,
        )
        return got.text


def served(model: str) -> str:
    """A LiteLLM model name without its provider prefix (``openai/smollm2`` -> ``smollm2``)."""
    return model.split("/", 1)[1] if "/" in model else model


def expected_information_gain(sigma: float | None, history_sd: float | None, fallback: float) -> float:
    """What evaluating a proposal is expected to teach, in nats: log(sd of the scores so far /
    the predicted sd), the entropy the prediction claims to remove from the no-think spread
    (0 when the prediction is no sharper, or nothing was scored yet)."""
    s = sigma if sigma is not None and sigma > 0 else fallback
    if not history_sd or history_sd <= 0 or s <= 0:
        return 0.0
    return max(0.0, math.log(history_sd / s))


def _failure_reason(exc: BaseException, *, structured: bool = False) -> str:
    # LiteLLM's Timeout derives from openai.APITimeoutError; neither is imported here.
    if isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        return "llm_timeout"
    if structured and "response_format" in str(exc):
        return REJECTED_FORMAT
    return "llm_error"


class RlpService:
    """RLP for the runs that ask for it; see the module docstring.

    ``think``, ``scorer`` and ``load_adapter`` replace the LiteLLM client, the log-probability
    scorer (default: ``FLYWHEEL_SOCIETY_MODELSERVER_URL`` when set) and the model server's
    adapter loading (tests). ``tasks``: background loops for the service to run."""

    def __init__(
        self,
        *,
        settings: SocietySettings,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Any,
        catalogue: Any,
        runs: Any,
        trainer: Any,
        objects: Any,
        start_sao: Callable[..., Awaitable[str]] | None,
        think: Thinker | None = None,
        scorer: LogprobScorer | None = None,
        load_adapter: Callable[[str, str], Awaitable[None]] | None = None,
        training_poll_s: float = 15.0,
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._publisher = publisher
        self._catalogue = catalogue
        self._runs = runs
        self._start_sao = start_sao
        thinker = LlmThinker(settings) if think is None else None
        self._think: Thinker = think or thinker  # type: ignore[assignment]
        self._scorer = scorer
        self._configs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._sao_started: set[tuple[str, int]] = set()
        self.training = PolicyTraining(
            settings=settings,
            sessions=sessions,
            trainer=trainer,
            objects=objects,
            load_adapter=load_adapter,
            poll_s=training_poll_s,
        )
        self.tasks: list[Callable[[], Awaitable[None]]] = [self.training.follow]
        if thinker is not None:
            self.tasks.append(self._warm(thinker))

    @staticmethod
    def _warm(thinker: LlmThinker) -> Callable[[], Awaitable[None]]:
        async def warm() -> None:
            try:
                await thinker.warm()
                log.info("reasoning model client ready")
            except Exception as exc:  # noqa: BLE001 - the first step will try again and fail with the reason
                log.warning("reasoning model client not ready", error=repr(exc))

        return warm

    # --- the consumer's handler ---------------------------------------------------------------

    async def on_progress(self, event: RunProgressEvent, delivery: Delivery) -> None:
        """Handle one run-progress event (idempotent; safe to run on several replicas)."""
        progress = event.progress
        run_id = progress.run_id
        if not run_id:
            raise Reject("run progress event without progress.run_id")
        finished = progress.state in FINISHED
        if progress.state != RUNNING and not finished:
            return
        lock = self._locks.setdefault(run_id, asyncio.Lock())
        async with lock:
            try:
                await self._handle(run_id, progress.generation, finished, delivery)
            finally:
                if finished:
                    self._locks.pop(run_id, None)
                    self._configs.pop(run_id, None)

    async def _handle(self, run_id: str, generation: int, finished: bool, delivery: Delivery) -> None:
        config = await self._run_config(run_id)
        if config is None:
            return
        try:
            society = parse_run_society(config)
        except RunSocietyError as exc:
            if not finished:
                await self._bad_config(run_id, config, str(exc))
            return
        space = space_fingerprint(config.get("search_space"))
        if society.rlp_active:
            await self._resolve_open(run_id, society, space, generation=generation, finished=finished)
            if not finished:
                await self._step(run_id, generation, society, config, space, redelivered=delivery.num_delivered > 1)
        if society.sao_active and not finished:
            await self._maybe_sao(run_id, generation, society)

    async def _run_config(self, run_id: str) -> dict[str, Any] | None:
        if run_id in self._configs:
            self._configs.move_to_end(run_id)
            return self._configs[run_id]
        from flywheel.society.clients import LinkError

        try:
            config = await self._runs.run_config(run_id)
        except LinkError as exc:
            if exc.code is not None and exc.code.name in ("NOT_FOUND", "INVALID_ARGUMENT"):
                log.info("progress of an unknown run ignored", run_id=run_id, error=str(exc))
                return None
            raise  # the optimizer away: redelivered later
        self._configs[run_id] = config
        while len(self._configs) > CONFIG_CACHE:
            self._configs.popitem(last=False)
        return config

    async def _bad_config(self, run_id: str, config: dict[str, Any], why: str) -> None:
        async with self._sessions() as session:
            if await buffer.claim_step(
                session,
                run_id=run_id,
                generation=BAD_CONFIG_GENERATION,
                space_fingerprint=space_fingerprint(config.get("search_space")),
            ):
                await buffer.fail_step(session, buffer.step_id_for(run_id, BAD_CONFIG_GENERATION), "bad_config", why)
                log.warning("run's society block is unusable", run_id=run_id, error=why)

    # --- a step: thoughts and proposals before generation g -----------------------------------

    def _model(self, society: RunSociety) -> str:
        requested = society.model or (society.rlp.model_name if "model_name" in society.rlp.model_fields_set else "")
        return choose_model(requested, self._settings.allowed_models())

    async def _step(
        self,
        run_id: str,
        generation: int,
        society: RunSociety,
        config: dict[str, Any],
        space: str,
        *,
        redelivered: bool,
    ) -> None:
        step_id = buffer.step_id_for(run_id, generation)
        async with self._sessions() as session:
            existing = await session.get(RlpStepRow, step_id)
            if existing is not None:
                if existing.state == buffer.THINKING:
                    await buffer.release_stale(session, run_id, self._settings.step_timeout_s + 60)
                elif existing.state == buffer.PROPOSED and redelivered:
                    await self._publish(run_id, await buffer.proposals_of(session, step_id))
                return
            policy = await buffer.get_policy(session, space)
            examples = await buffer.few_shot(session, space, self._settings.few_shot)
        try:
            base = self._model(society)
        except RunSocietyError as exc:
            await self._failed_step(run_id, generation, space, "", "model_not_allowed", str(exc))
            return
        model = base
        if policy is not None and policy.policy_model:
            model = (base.split("/", 1)[0] + "/" if "/" in base else "") + policy.policy_model
        async with self._sessions() as session:
            if not await buffer.claim_step(
                session, run_id=run_id, generation=generation, space_fingerprint=space, model=model
            ):
                return  # another replica or delivery has this step
        try:
            await self._think_and_propose(run_id, generation, step_id, society, config, model, examples)
        except BaseException:
            # The optimizer or PostgreSQL away, or a stop: give the claim back, so the
            # redelivered event makes the step (a step already proposed keeps its state).
            async with self._sessions() as session:
                await buffer.release_claim(session, step_id)
            raise

    async def _think_and_propose(
        self,
        run_id: str,
        generation: int,
        step_id: str,
        society: RunSociety,
        config: dict[str, Any],
        model: str,
        examples: list[dict[str, str]],
    ) -> None:
        rlp = society.rlp
        candidates, _ = await self._runs.candidates(run_id)
        parameters = space_parameters(config.get("search_space"))
        history = history_of(candidates)
        messages, context = build_context(
            history=history,
            search_space=parameters,
            n_thoughts=rlp.num_thoughts,
            proposals_per_thought=rlp.proposals_per_thought,
            examples=examples,
        )
        response_format = None
        if self._settings.rlp_structured_output:
            response_format = thoughts_response_format(
                parameters,
                n_thoughts=rlp.num_thoughts,
                proposals_per_thought=rlp.proposals_per_thought,
                thought_length=rlp.thought_length,
                scores=[h["score"] for h in history],
            )
        started = time.perf_counter()
        try:
            text = await asyncio.wait_for(
                self._think(
                    messages,
                    model=model,
                    temperature=rlp.temperature,
                    max_tokens=rlp.thought_length,
                    response_format=response_format,
                ),
                self._settings.step_timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any provider failure is this step's failure
            reason = _failure_reason(exc, structured=response_format is not None)
            detail = f"{type(exc).__name__}: {exc}"
            if reason == REJECTED_FORMAT:
                detail = f"{detail} (set {self._settings.env_var('rlp_structured_output')}=false for this provider)"
            await self._fail(step_id, reason, detail, context=context)
            return
        if not (text or "").strip():
            await self._fail(step_id, "llm_empty", "the reasoning model returned nothing", context=context)
            return
        parsed: ParseResult = parse_thoughts(text, min_thoughts=2, max_thoughts=rlp.num_thoughts)
        if not parsed.ok:
            await self._fail(step_id, "no_prediction", f"{parsed.failure}; answer: {text[:500]!r}", context=context)
            return
        seen = {config_key(c["params"]) for c in candidates} | {params_key(c["params"]) for c in candidates}
        try:
            chosen = choose_proposals(parsed, seen=seen, space=parameters, k=society.proposals_per_generation)
        except SpaceError as exc:
            await self._fail(step_id, "bad_space", str(exc), context=context, thoughts=parsed)
            return
        if not chosen:
            await self._fail(
                step_id,
                "no_new_proposal",
                "every proposed config was already evaluated, outside the search space, or none were asked for",
                context=context,
                thoughts=parsed,
            )
            return
        scores = [h["score"] for h in history]
        spread = statistics.pstdev(scores) if len(scores) >= 2 else None
        rows = [self._proposal_row(run_id, generation, step_id, i, p) for i, p in chosen]
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(RlpStepRow)
                .where(RlpStepRow.step_id == step_id)
                .values(
                    state=buffer.PROPOSED,
                    context=context,
                    thoughts=thoughts_to_json(parsed.thoughts),
                    detail="; ".join(parsed.dropped)[:2000],
                )
            )
            for row in rows:
                session.add(row)
        texts = [t.text for t in parsed.thoughts]
        await self._publish(
            run_id,
            rows,
            rationale={r.proposal_id: texts[r.thought_index] for r in rows},
            gain={
                r.proposal_id: expected_information_gain(p.sigma, spread, rlp.fallback_sigma)
                for r, (_, p) in zip(rows, chosen, strict=True)
            },
        )
        log.info(
            "rlp step proposed",
            run_id=run_id,
            generation=generation,
            thoughts=len(parsed.thoughts),
            proposals=len(rows),
            seconds=round(time.perf_counter() - started, 2),
        )

    def _proposal_row(
        self, run_id: str, generation: int, step_id: str, thought: int, p: ProposedConfig
    ) -> RlpProposalRow:
        return RlpProposalRow(
            proposal_id=buffer.proposal_id_for(step_id, params_key(p.params)),
            step_id=step_id,
            run_id=run_id,
            generation=generation,
            thought_index=thought,
            config_key=params_key(p.params),
            config=p.params,
            predicted_score=p.predicted_score,
        )

    async def _publish(
        self,
        run_id: str,
        rows: list[RlpProposalRow],
        *,
        rationale: Mapping[str, str] | None = None,
        gain: Mapping[str, float] | None = None,
    ) -> None:
        """One ProposalEvent per proposal; the event id is the proposal id (deterministic), so a
        republished proposal is deduplicated by JetStream and by the optimizer's injection id."""
        subject = self._catalogue.society_proposal(run_id)
        for row in rows:
            now = Timestamp()
            now.GetCurrentTime()
            config = struct_pb2.Struct()
            config.update(row.config)
            event = ProposalEvent(
                meta=EventMeta(event_id=row.proposal_id, time=now, source="society/rlp"),
                run_id=run_id,
                config=config,
                source=PROPOSAL_SOURCE_RLP,
                rationale=((rationale or {}).get(row.proposal_id) or f"RLP step {row.step_id}")[:RATIONALE_CHARS],
                expected_information_gain=float((gain or {}).get(row.proposal_id, 0.0)),
            )
            await self._publisher.publish(subject, event, msg_id=row.proposal_id)

    async def _fail(
        self, step_id: str, reason: str, detail: str, *, context: str = "", thoughts: ParseResult | None = None
    ) -> None:
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(RlpStepRow)
                .where(RlpStepRow.step_id == step_id)
                .values(
                    state=buffer.FAILED,
                    reason=reason,
                    detail=detail[:2000],
                    context=context,
                    thoughts=thoughts_to_json(thoughts.thoughts) if thoughts else [],
                    resolved_at=func.now(),
                )
            )
        log.info("rlp step failed", step_id=step_id, reason=reason, detail=detail[:200])

    async def _failed_step(self, run_id: str, generation: int, space: str, model: str, reason: str, why: str) -> None:
        async with self._sessions() as session:
            if await buffer.claim_step(
                session, run_id=run_id, generation=generation, space_fingerprint=space, model=model
            ):
                await buffer.fail_step(session, buffer.step_id_for(run_id, generation), reason, why)

    # --- resolution: rewards once the generation's results are in -----------------------------

    def _scorer_or_none(self) -> LogprobScorer | None:
        if self._scorer is None and self._settings.modelserver_url:
            url = self._settings.modelserver_url.rstrip("/")
            key = self._settings.modelserver_api_key
            self._scorer = LogprobScorer(
                url if url.endswith("/v1") else url + "/v1",
                key.get_secret_value() if key else None,
                timeout=self._settings.step_timeout_s,
            )
        return self._scorer

    async def _resolve_open(
        self, run_id: str, society: RunSociety, space: str, *, generation: int, finished: bool
    ) -> None:
        async with self._sessions() as session:
            steps = await buffer.open_steps(session, run_id, before_generation=None if finished else generation)
        if not steps:
            return
        candidates, current = await self._runs.candidates(run_id)
        current = max(current, generation)
        for step in steps:
            async with self._sessions() as session:
                sent = [{"config": p.config} for p in await buffer.proposals_of(session, step.step_id)]
            thoughts = thoughts_from_json(step.thoughts)
            res = resolve(
                thoughts,
                sent,
                candidates,
                current_generation=current,
                finished=finished,
                step_generation=step.generation,
            )
            if not res.ready:
                continue
            await self._reward(step, society, space, thoughts, res, candidates, finished=finished)

    async def _reward(
        self,
        step: RlpStepRow,
        society: RunSociety,
        space: str,
        thoughts: list[Thought],
        res: Resolution,
        candidates: list[dict[str, Any]],
        *,
        finished: bool,
    ) -> None:
        rlp: RLPConfig = society.rlp
        base = served(self._model(society)) if self._model_ok(society) else served(step.model)
        scoring = rlp.model_copy(
            update={"model_name": served(step.model) or base, "base_model_name": rlp.base_model_name or base}
        )
        earlier = [
            float(c["score"]) for c in candidates if int(c.get("cases", 0)) > 0 and c["generation"] < step.generation
        ]
        every = [float(c["score"]) for c in candidates if int(c.get("cases", 0)) > 0]
        baseline_mean = statistics.fmean(earlier or every) if (earlier or every) else None
        gains: list[tuple[int, Any, dict[str, float]]] = []
        try:
            for i, (thought, observed) in enumerate(zip(thoughts, res.thoughts, strict=True)):
                if not observed:
                    continue
                gain = await thought_reward(
                    scoring,
                    context=step.context,
                    thought=thought,
                    observed=observed,
                    scorer=self._scorer_or_none(),
                    baseline_mean=baseline_mean,
                )
                if not math.isfinite(gain.reward):
                    raise ScoringError(f"thought {i}: the reward is not finite ({gain.reward})")
                gains.append((i, gain, observed))
        except ScoringError as exc:
            async with self._sessions() as session:
                await buffer.fail_step(session, step.step_id, "scoring_failed", str(exc))
            log.warning("rlp step not rewarded", step_id=step.step_id, error=str(exc))
            return
        unrewarded = len(thoughts) - len(gains)
        raw = [g.reward for _, g, _ in gains]
        advantages = group_advantages(raw) if len(raw) >= 2 else [0.0] * len(raw)
        async with self._sessions() as session, session.begin():
            policy = await buffer.policy_for_update(session, space)
            state = policy.normalizer or {}
            norm = RewardNormalizer.from_dict(state) if "count" in state else RewardNormalizer()
            if rlp.normalize_rewards and raw:
                norm.update(raw)
                normalized = [norm.normalize(r) for r in raw]
            else:
                normalized = list(raw)
            policy.normalizer = {**state, **norm.to_dict()}
            for p in await buffer.proposals_of(session, step.step_id):
                seen = res.observed.get(p.config_key)
                if seen is not None:
                    p.observed_score, p.generation_median, p.hit = seen.score, seen.median, seen.hit
            await buffer.add_experiences(
                session,
                [
                    {
                        "space_fingerprint": space,
                        "run_id": step.run_id,
                        "generation": step.generation,
                        "step_id": step.step_id,
                        "thought_index": i,
                        "context": step.context,
                        "thought": thoughts[i].text,
                        "outcome": render_outcome(observed),
                        "reward": gain.reward,
                        "definition": gain.definition,
                        "baseline": "; ".join([gain.baseline, *gain.notes])[:2000],
                        "normalized_reward": n,
                        "advantage": a,
                        "gae_advantage": 0.0,
                    }
                    for (i, gain, observed), n, a in zip(gains, normalized, advantages, strict=True)
                ],
            )
            await session.execute(
                update(RlpStepRow)
                .where(RlpStepRow.step_id == step.step_id)
                .values(
                    state=buffer.REWARDED,
                    resolved_at=func.now(),
                    detail=(f"{unrewarded} thought(s) without an evaluated config, not rewarded" if unrewarded else ""),
                )
            )
            await session.flush()
            per_step = await buffer.run_step_rewards(session, step.run_id)
            gae_values = step_gae(
                [m for _, _, m in per_step], gamma=rlp.gamma, gae_lambda=rlp.gae_lambda, done=finished
            )
            for (sid, _, mean), adv in zip(per_step, gae_values, strict=True):
                await buffer.set_step_gae(session, sid, mean, adv)
            # The buffer is shared by every run on the space: its capacity is the operator's
            # (FLYWHEEL_SOCIETY_BUFFER_SIZE), not one run's learning.rlp.buffer_size.
            await buffer.cap_buffer(session, space, self._settings.buffer_size)
        log.info(
            "rlp step rewarded",
            step_id=step.step_id,
            run_id=step.run_id,
            generation=step.generation,
            rewards=[round(r, 3) for r in raw],
            unrewarded=unrewarded,
        )
        try:
            await self.training.maybe_train(space, rlp)
        except Exception as exc:  # noqa: BLE001 - training is retried at the next resolution
            log.warning("rlp policy training not submitted", space=space, error=repr(exc))

    def _model_ok(self, society: RunSociety) -> bool:
        try:
            self._model(society)
        except RunSocietyError:
            return False
        return True

    # --- SAO rounds of a run -------------------------------------------------------------------

    async def _maybe_sao(self, run_id: str, generation: int, society: RunSociety) -> None:
        if self._start_sao is None or generation <= 0 or generation % society.sao_every:
            return
        key = (run_id, generation)
        if key in self._sao_started:
            return
        self._sao_started.add(key)
        dataset_id = re.sub(r"[^A-Za-z0-9._-]", "-", f"sao-{run_id}-g{generation}")[:128]
        try:
            model = self._model(society)
            round_id = await self._start_sao(run_id=run_id, config=society.sao, model=model, dataset_id=dataset_id)
        except Exception as exc:  # noqa: BLE001 - an SAO round is best effort; the run goes on
            log.warning("sao round not started", run_id=run_id, generation=generation, error=repr(exc))
            return
        log.info("sao round started for run", run_id=run_id, generation=generation, round_id=round_id)
