"""Handling one evaluation request from the work queue, exactly once.

Order matters: the trace and then the result are published with dedup ids derived from
the request id, and only once JetStream has acknowledged both does the consumer ack the
request. A crash before the ack redelivers the request; evaluating it again publishes
under the same ids, so JetStream drops the copy and the result stream holds one result
per request (consumers should still count results by ``request_id``, which also covers
a redelivery later than the stream's duplicate window).

A request that can never succeed (malformed, refused by the run policy, or one whose
evaluation fails for a reason other than its target, such as an input the evaluator cannot
read) is answered with an error result, so its run counts it instead of waiting, and is
dead-lettered with the reason: it is never retried. Only publishing (NATS away) is retried."""

from __future__ import annotations

from flywheel.api.evaluator.v1.events_pb2 import EvaluationRequest
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1.spans_pb2 import SpanBatch
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.bus.publisher import Publisher
from flywheel.core.logging import bound, get_logger
from flywheel.core.validation import string_problem
from flywheel.evaluator.service import Evaluator
from flywheel.evaluator.tracing import AGENT
from flywheel.evaluator.validation import MAX_ID_CHARS, problems

log = get_logger(__name__)


class EvaluationHandler:
    """Validates, evaluates, publishes the trace and the result."""

    def __init__(self, evaluator: Evaluator, publisher: Publisher, catalogue: Catalogue) -> None:
        self._evaluator = evaluator
        self._publisher = publisher
        self._catalogue = catalogue

    async def __call__(self, req: EvaluationRequest, delivery: Delivery) -> None:
        found = problems(req, policy=self._evaluator.policy)
        if found:
            reason = "malformed evaluation request: " + "; ".join(found)
            log.warning("evaluation request refused", request_id=req.request_id[:200], reason=reason)
            await self._answer_rejected(req, reason)
            raise Reject(reason)
        with bound(request_id=req.request_id, run_id=req.run_id, attempt=delivery.num_delivered):
            try:
                evaluation = await self._evaluator.evaluate(req)
            except Exception as exc:  # evaluating touches no bus: another try would fail the same
                log.exception("evaluation failed")
                reason = f"evaluation failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                await self._answer_rejected(req, reason)
                raise Reject(reason) from None
            result = evaluation.result
            batch = SpanBatch(meta=result.meta, spans=evaluation.spans)
            batch.meta.event_id = f"evaluation-trace:{req.request_id}"
            await self._publisher.publish(self._catalogue.traces(AGENT), batch)
            await self._publisher.publish(self._catalogue.evaluation_result(req.run_id), result)
            if result.error:
                log.info("evaluation failed", error=result.error)

    async def _answer_rejected(self, req: EvaluationRequest, reason: str) -> None:
        """A run waits for a result per request: when the request names its run and its id,
        it also gets an error result, so the run can count it instead of waiting forever."""
        try:
            subject = self._catalogue.evaluation_result(req.run_id)
        except ValueError:
            return
        if not req.request_id or string_problem(req.request_id, max_len=MAX_ID_CHARS):
            return
        result = self._evaluator.empty_result(req)
        result.error = reason
        await self._publisher.publish(subject, result)
