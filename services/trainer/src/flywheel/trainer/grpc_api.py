"""gRPC servicer of the trainer: the policy registry's methods (GetPolicy, ListPolicies,
SetPolicyStatus, RegisterPolicy, PromotePolicy, RollbackPolicy) and the jobs' (SubmitJob,
GetJob, ListJobs, CancelJob). Every request is checked at the door; every status change
publishes its PolicyChangedEvent once it has committed."""

from __future__ import annotations

import grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.subjects import subject_token
from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.api.trainer.v1 import trainer_service_pb2 as pb
from flywheel.api.trainer.v1 import trainer_service_pb2_grpc as pb_grpc
from flywheel.core.validation import Invalid, check_enum, check_numbers, check_string
from flywheel.trainer.jobs import service as jobs
from flywheel.trainer.jobs.submit import Submitter
from flywheel.trainer.registry import service
from flywheel.trainer.registry.events import PolicyEvents, policy_message
from flywheel.trainer.registry.rules import Status

MAX_ID = 64
MAX_URI = 2048
MAX_REASON = 2048
MAX_ACTOR = 256


MAX_LIST = 1000


def _policy_id(value: str, field: str = "policy_id") -> str:
    return check_string(value, field, max_len=MAX_ID, required=True, what="a policy version's id")


def _name(value: str, field: str = "name") -> str:
    check_string(value, field, max_len=MAX_ID, required=True, what="the policy's name")
    try:
        return subject_token(value, what="name")
    except ValueError:
        raise Invalid(field, "must be 1-64 characters of [A-Za-z0-9_-] (it is a NATS subject token)") from None


def _who(request: object) -> tuple[str, str]:
    actor = check_string(getattr(request, "actor"), "actor", max_len=MAX_ACTOR)  # noqa: B009
    reason = check_string(getattr(request, "reason"), "reason", max_len=MAX_REASON)  # noqa: B009
    return actor or "unknown", reason


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], events: PolicyEvents, submitter: Submitter) -> None:
        self._sessions = sessions
        self._events = events
        self._submitter = submitter

    # -- jobs ----------------------------------------------------------------------------------

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.SubmitJobResponse:
        if not request.HasField("spec"):
            raise Invalid("spec", "is required")
        return await self._submitter.submit(request)

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.GetJobResponse:
        job_id = check_string(request.job_id, "job_id", max_len=MAX_ID, required=True, what="a job id")
        async with self._sessions() as session:
            row = await jobs.get(session, job_id=job_id)
        return pb.GetJobResponse(job=jobs.job_message(row))

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        state = check_enum(request.state, jobs_pb2.JobState, "state", allow_unspecified=True)
        if not 0 <= request.limit <= MAX_LIST:
            raise Invalid("limit", f"must be in [0, {MAX_LIST}] (0 means 100)")
        async with self._sessions() as session:
            rows = await jobs.list_jobs(session, state=jobs.STATE_NAMES.get(state, ""), limit=request.limit or 100)
        return pb.ListJobsResponse(jobs=[jobs.job_message(r) for r in rows])

    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.CancelJobResponse:
        job_id = check_string(request.job_id, "job_id", max_len=MAX_ID, required=True, what="a job id")
        async with self._sessions() as session:
            row = await jobs.request_cancel(session, job_id=job_id)
            await session.commit()
            await session.refresh(row)
        return pb.CancelJobResponse(job=jobs.job_message(row))

    # -- the policy registry ---------------------------------------------------------------

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: grpc.aio.ServicerContext) -> pb.GetPolicyResponse:
        _policy_id(request.policy_id)
        async with self._sessions() as session:
            row = await service.get_policy(session, policy_id=request.policy_id)
        return pb.GetPolicyResponse(policy=policy_message(row))

    async def ListPolicies(
        self, request: pb.ListPoliciesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPoliciesResponse:
        check_string(request.name, "name", max_len=MAX_ID)
        async with self._sessions() as session:
            rows = await service.list_policies(session, name=request.name)
        return pb.ListPoliciesResponse(policies=[policy_message(r) for r in rows])

    async def SetPolicyStatus(
        self, request: pb.SetPolicyStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetPolicyStatusResponse:
        _policy_id(request.policy_id)
        status = Status(check_enum(request.status, jobs_pb2.PolicyStatus, "status", allow_unspecified=False))
        actor, reason = _who(request)
        async with self._sessions() as session:
            outcome = await service.set_status(
                session, policy_id=request.policy_id, status=status, actor=actor, reason=reason
            )
        await self._events.publish(outcome.history)
        return pb.SetPolicyStatusResponse(policy=policy_message(outcome.policies[request.policy_id]))

    async def RegisterPolicy(
        self, request: pb.RegisterPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterPolicyResponse:
        name = _name(request.name)
        kind = check_enum(request.kind, jobs_pb2.TrainingKind, "kind", allow_unspecified=False)
        for field in ("base_model", "checkpoint_uri", "dataset_uri"):
            check_string(getattr(request, field), field, max_len=MAX_URI)
        check_string(request.job_id, "job_id", max_len=MAX_ID)
        check_string(request.parent_policy_id, "parent_policy_id", max_len=MAX_ID)
        check_numbers(request.metrics, "metrics")
        actor, reason = _who(request)
        registration = service.Registration(
            name=name,
            kind=kind,
            base_model=request.base_model,
            checkpoint_uri=request.checkpoint_uri,
            dataset_uri=request.dataset_uri,
            job_id=request.job_id,
            parent_policy_id=request.parent_policy_id,
            metrics=dict(request.metrics),
        )
        async with self._sessions() as session:
            outcome = await service.register(session, registration=registration, actor=actor, reason=reason)
        await self._events.publish(outcome.history)
        (row,) = outcome.policies.values()
        return pb.RegisterPolicyResponse(policy=policy_message(row))

    async def PromotePolicy(
        self, request: pb.PromotePolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PromotePolicyResponse:
        _policy_id(request.policy_id)
        actor, reason = _who(request)
        async with self._sessions() as session:
            outcome = await service.promote(session, policy_id=request.policy_id, actor=actor, reason=reason)
        await self._events.publish(outcome.history)
        response = pb.PromotePolicyResponse(policy=policy_message(outcome.policies[request.policy_id]))
        for pid, row in outcome.policies.items():
            if pid != request.policy_id:
                response.retired.CopyFrom(policy_message(row))
        return response

    async def RollbackPolicy(
        self, request: pb.RollbackPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.RollbackPolicyResponse:
        name = _name(request.name)
        actor, reason = _who(request)
        async with self._sessions() as session:
            outcome = await service.rollback(session, name=name, actor=actor, reason=reason)
        await self._events.publish(outcome.history)
        response = pb.RollbackPolicyResponse()
        for row in outcome.policies.values():
            target = response.policy if row.status == Status.ACTIVE else response.rolled_back
            target.CopyFrom(policy_message(row))
        return response
