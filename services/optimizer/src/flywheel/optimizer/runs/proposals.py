"""Outside proposals (society ProposalEvents) into the running generation of their run."""

from __future__ import annotations

from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.society.v1.events_pb2 import ProposalEvent, ProposalSource
from flywheel.core.bus.consumer import Delivery, Reject
from flywheel.core.errors import FailedPrecondition, InvalidArgument, NotFound
from flywheel.optimizer.runs import service


class ProposalHandler:
    """Queues a proposal for its run; proposals for unknown or finished runs, or configs that
    do not fit the search space, are dead-lettered with the reason."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def __call__(self, event: ProposalEvent, delivery: Delivery) -> None:
        if not event.meta.event_id:
            raise Reject("proposal has no meta.event_id (it keys the injection, so a redelivery is applied once)")
        config = json_format.MessageToDict(event.config)
        if not config:
            raise Reject("proposal has an empty config")
        origin = ProposalSource.Name(event.source).removeprefix("PROPOSAL_SOURCE_").lower() or "injected"
        try:
            async with self._sessions() as session:
                await service.inject(
                    session,
                    run_id=event.run_id,
                    configs=[config],
                    origin=origin if origin != "unspecified" else "injected",
                    injection_id=event.meta.event_id,
                )
        except (InvalidArgument, NotFound, FailedPrecondition) as exc:
            raise Reject(str(exc)) from None
