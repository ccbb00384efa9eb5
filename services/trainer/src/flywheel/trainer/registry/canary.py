"""Into production: a trained version becomes a canary arm of an optimizer endpoint, and the
registry follows the bandit's verdict on that arm.

``Canaries.enrol`` asks the model server to load the version's adapter (vLLM's
``POST /v1/load_lora_adapter``; ``checkpoint_uri`` is the S3 prefix of the adapter folder)
under the model name ``<name>-v<version>``, adds a CANARY arm to the endpoint
(``EndpointAdminService.AddArm``) and marks the version CANARY with its endpoint and arm.

The arm's params are the incumbent's (the endpoint's incumbent arm when it is active, else
its first active arm) with two changes: ``model`` becomes the served model name, keeping the
incumbent's provider prefix (the text up to its first ``/``: ``openai/smollm2`` gives
``openai/support-dpo-v3``, ``smollm2`` gives ``support-dpo-v3``), and ``policy_id`` names the
version. Everything else (``api_base``, temperature, prompt...) is kept: the canary is served
by the same model server as the arm it challenges.

The optimizer then caps the canary's traffic and judges it (promote at P(better) >= its
threshold after enough pulls, retire below). ``follow_once`` compares every enrolled version
with its arm and moves the registry after the bandit:

=============  =================  ===============================================
version        arm                registry change
=============  =================  ===============================================
canary         active (promoted)  Promote (the previously active version retires)
canary         retired or gone    rolled back (its adapter is unloaded)
active         retired or gone    Rollback (the previous active version returns)
=============  =================  ===============================================

Polling rather than an event is deliberate: the optimizer judges canaries in its own
background loop and keeps only the arm's status, so asking for it heals after any outage (the
trainer down, the bus down, a verdict missed): the next poll sees the arm as it is now. Each
change goes through the registry's service functions and publishes its PolicyChangedEvent."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.tls import ClientTls, aio_channel
from flywheel.core.errors import FailedPrecondition, NotFound, ServiceError, Unavailable
from flywheel.core.logging import get_logger
from flywheel.core.validation import Invalid
from flywheel.trainer.registry import rules, service
from flywheel.trainer.registry.events import PolicyEvents
from flywheel.trainer.registry.models import PolicyRow
from flywheel.trainer.registry.rules import Status

log = get_logger(__name__)
ACTOR = "trainer canary follower"
DEFAULT_TRAFFIC_CAP = 0.1
_ARM_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Links:
    """Where the optimizer and the model server are, and how to authenticate to them."""

    optimizer_address: str
    optimizer_tls: ClientTls | None = None
    optimizer_token: str | None = None
    optimizer_timeout_s: float = 10.0
    # OpenAI-compatible base URL of the model server (with or without the trailing /v1);
    # empty: nothing is asked to load adapters (they are served some other way).
    modelserver_url: str = ""
    modelserver_api_key: str | None = None
    modelserver_timeout_s: float = 300.0  # a load downloads the adapter from S3 first


@dataclass(frozen=True)
class Followed:
    """One registry change made after the bandit (what ``follow_once`` returns)."""

    policy_id: str
    name: str
    version: int
    status: Status
    reason: str


def served_model_name(row: PolicyRow) -> str:
    """The model name a version is served under: ``<name>-v<version>``."""
    return f"{row.name}-v{row.version}"


def canary_params(incumbent: ep_pb.Arm, model: str, policy_id: str) -> Struct:
    """The incumbent's params with ``model`` (provider prefix kept) and ``policy_id`` set."""
    params: dict[str, Any] = json_format.MessageToDict(incumbent.params)
    old = params.get("model")
    prefix = old.split("/", 1)[0] + "/" if isinstance(old, str) and "/" in old else ""
    params["model"] = prefix + model
    params["policy_id"] = policy_id
    out = Struct()
    out.update(params)
    return out


def incumbent_arm(endpoint: ep_pb.Endpoint) -> ep_pb.Arm:
    """The arm a canary challenges: the endpoint's incumbent when it is active, else its first active arm."""
    actives = [a for a in endpoint.arms if a.status == ep_pb.ARM_STATUS_ACTIVE]
    if not actives:
        raise FailedPrecondition(f"endpoint {endpoint.name!r} has no active arm for a canary to challenge")
    return next((a for a in actives if a.arm_id == endpoint.incumbent_arm_id), actives[0])


class Canaries:
    """Enrols versions as canary arms and moves the registry after the bandit's verdicts.

    ``sessions`` and ``events`` are the registry's; ``links`` says where the optimizer and
    the model server are (``Canaries.from_settings`` reads them from TrainerSettings)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], events: PolicyEvents, links: Links) -> None:
        self._sessions = sessions
        self._events = events
        self._links = links
        self._metadata = (("authorization", f"Bearer {links.optimizer_token}"),) if links.optimizer_token else ()
        self._channel: grpc.aio.Channel | None = None
        self._admin: admin_grpc.EndpointAdminServiceStub | None = None
        self._http: httpx.AsyncClient | None = None

    @classmethod
    def from_settings(cls, sessions: async_sessionmaker[AsyncSession], events: PolicyEvents, settings: Any) -> Canaries:
        """From TrainerSettings (``optimizer_*`` and ``modelserver_*``)."""
        key = settings.modelserver_api_key
        return cls(
            sessions,
            events,
            Links(
                optimizer_address=settings.optimizer_address,
                optimizer_tls=settings.link_tls("optimizer"),
                optimizer_token=settings.link_token("optimizer"),
                optimizer_timeout_s=settings.optimizer_timeout_s,
                modelserver_url=settings.modelserver_url,
                modelserver_api_key=key.get_secret_value() if key is not None else None,
            ),
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._admin = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- enrolment ----------------------------------------------------------------------------
    async def enrol(self, *, policy_id: str, endpoint: str, traffic_cap: float, actor: str) -> str:
        """Serve version ``policy_id`` as a canary arm of ``endpoint`` with at most
        ``traffic_cap`` of its traffic (0: 0.1); returns the arm id. Calling it again for a
        version already enrolled there returns the same arm (a retried job does no harm)."""
        cap = traffic_cap or DEFAULT_TRAFFIC_CAP
        if not 0 < cap <= 1:
            raise Invalid("traffic_cap", f"must be in (0, 1], got {traffic_cap}")
        if not endpoint:
            raise Invalid("endpoint", "required")
        async with self._sessions() as session:
            row = await service.get_policy(session, policy_id=policy_id)
        if row.status == Status.CANARY and row.endpoint == endpoint and row.arm_id:
            return row.arm_id
        rules.check_transition(rules.Version(row.policy_id, row.version, Status(row.status)), Status.CANARY)
        if not row.checkpoint_uri and self._links.modelserver_url:
            raise FailedPrecondition(f"policy {policy_id}: no checkpoint_uri, so there is no adapter to serve")
        model = served_model_name(row)
        arm_id = _ARM_CHARS.sub("-", model)[:128]
        admin = self._optimizer()
        found = await self._get_endpoint(admin, endpoint)
        if found is None:
            raise NotFound(f"endpoint: no optimizer endpoint {endpoint!r}")
        existing = next((a for a in found.arms if a.arm_id == arm_id), None)
        params = canary_params(incumbent_arm(found), model, policy_id)
        if existing is not None and existing.params.fields.get("policy_id") != params.fields["policy_id"]:
            raise FailedPrecondition(f"endpoint {endpoint!r} already has an arm {arm_id!r} of another version")
        served = ""
        if self._links.modelserver_url:
            await self._load(row, model, actor=actor)
            served = model
        if existing is None:
            arm = ep_pb.Arm(arm_id=arm_id, params=params, status=ep_pb.ARM_STATUS_CANARY, traffic_cap=cap)
            try:
                await admin.AddArm(
                    admin_pb.AddArmRequest(endpoint=endpoint, arm=arm),
                    timeout=self._links.optimizer_timeout_s,
                    metadata=self._metadata,
                )
            except grpc.aio.AioRpcError as exc:
                raise Unavailable(f"optimizer AddArm on {endpoint!r}: {exc.code().name}: {exc.details()}") from None
        async with self._sessions() as session:
            outcome = await service.enrol(
                session,
                policy_id=policy_id,
                endpoint=endpoint,
                arm_id=arm_id,
                served_model=served,
                actor=actor,
                reason=f"canary arm {arm_id} of endpoint {endpoint} (traffic cap {cap:g})",
            )
        await self._events.publish(outcome.history)
        log.info("policy enrolled as canary", policy_id=policy_id, endpoint=endpoint, arm_id=arm_id, model=model)
        return arm_id

    async def _load(self, row: PolicyRow, model: str, *, actor: str) -> None:
        """Ask the model server to serve the adapter. An adapter it cannot find or load marks
        the version FAILED; anything else (unreachable, wrong key, a path it does not allow,
        no room) is the deployment's problem and leaves the version as it was."""
        try:
            resp = await self._client().post(
                "/v1/load_lora_adapter", json={"lora_name": model, "lora_path": row.checkpoint_uri}
            )
        except httpx.HTTPError as exc:
            raise Unavailable(f"model server at {self._links.modelserver_url}: {exc!r}") from None
        if resp.status_code == 200 or _error_code(resp) == "lora_already_loaded":
            return
        message = _error_message(resp)
        if resp.status_code >= 500:
            raise Unavailable(f"model server could not load {model}: HTTP {resp.status_code}: {message}")
        if _error_code(resp) not in ("lora_load_failed", "lora_not_found"):
            raise FailedPrecondition(f"model server refused to load {model}: HTTP {resp.status_code}: {message}")
        async with self._sessions() as session:
            outcome = await service.set_status(
                session,
                policy_id=row.policy_id,
                status=Status.FAILED,
                actor=actor,
                reason=f"the model server refused its adapter: HTTP {resp.status_code}: {message}"[:2000],
            )
        await self._events.publish(outcome.history)
        raise FailedPrecondition(f"model server refused to load {row.checkpoint_uri} as {model}: {message}")

    async def _unload(self, row: PolicyRow) -> None:
        if not (row.served_model and self._links.modelserver_url):
            return
        try:
            resp = await self._client().post("/v1/unload_lora_adapter", json={"lora_name": row.served_model})
            if resp.status_code not in (200, 404):  # 404: already gone
                log.warning("adapter not unloaded", model=row.served_model, status=resp.status_code)
        except httpx.HTTPError as exc:
            log.warning("adapter not unloaded", model=row.served_model, error=repr(exc))

    # -- following the bandit -----------------------------------------------------------------
    async def follow_once(self) -> list[Followed]:
        """Compare every enrolled canary or active version with its arm and move the registry
        after the bandit's verdict; returns the changes made. An endpoint the optimizer cannot
        be asked about now is skipped (the next call tries again)."""
        async with self._sessions() as session:
            rows = await service.served(session)
        if not rows:
            return []
        by_endpoint: dict[str, list[PolicyRow]] = defaultdict(list)
        for row in rows:
            by_endpoint[row.endpoint].append(row)
        admin = self._optimizer()
        done: list[Followed] = []
        for endpoint, group in by_endpoint.items():
            try:
                found = await self._get_endpoint(admin, endpoint)
            except Unavailable as exc:
                log.warning("canary follower: endpoint not read; next time", endpoint=endpoint, error=str(exc))
                continue
            arms = {a.arm_id: a for a in found.arms} if found is not None else {}
            for row in group:
                try:
                    followed = await self._follow(row, arms.get(row.arm_id), deleted=found is None)
                except ServiceError as exc:  # changed meanwhile (an operator?): read again next time
                    log.warning("canary follower: change refused", policy_id=row.policy_id, error=str(exc))
                    continue
                if followed is not None:
                    done.append(followed)
        return done

    async def follow_forever(self, interval_s: float) -> None:
        """``follow_once`` every ``interval_s`` seconds until cancelled; a failed round is
        logged and the next one tries again."""
        while True:
            try:
                await self.follow_once()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL or the optimizer down: heal next round
                log.warning("canary follower round failed", error=repr(exc))
            await asyncio.sleep(interval_s)

    async def _follow(self, row: PolicyRow, arm: ep_pb.Arm | None, *, deleted: bool) -> Followed | None:
        where = f"arm {row.arm_id} of endpoint {row.endpoint}"
        if arm is None:
            gone = f"endpoint {row.endpoint} was deleted" if deleted else f"{where} is gone"
        elif arm.status == ep_pb.ARM_STATUS_RETIRED:
            gone = f"the bandit retired {where} (or it was retired by RetireArm)"
        else:
            gone = ""
        async with self._sessions() as session:
            if row.status == Status.CANARY and arm is not None and arm.status == ep_pb.ARM_STATUS_ACTIVE:
                reason = f"the bandit promoted {where}"
                outcome = await service.promote(session, policy_id=row.policy_id, actor=ACTOR, reason=reason)
            elif row.status == Status.CANARY and gone:
                reason = f"rolled back: {gone}"
                outcome = await service.set_status(
                    session, policy_id=row.policy_id, status=Status.ROLLED_BACK, actor=ACTOR, reason=reason
                )
            elif row.status == Status.ACTIVE and gone:
                reason = f"rolled back: {gone}"
                outcome = await self._roll_back_active(session, row, reason)
            else:
                return None
        await self._events.publish(outcome.history)
        after = outcome.policies[row.policy_id]
        if after.status in (Status.ROLLED_BACK, Status.RETIRED):
            await self._unload(after)
        log.info("registry follows the bandit", policy_id=row.policy_id, status=Status(after.status).label, why=reason)
        return Followed(row.policy_id, row.name, row.version, Status(after.status), reason)

    async def _roll_back_active(self, session: AsyncSession, row: PolicyRow, reason: str) -> service.Outcome:
        try:
            return await service.rollback(session, name=row.name, actor=ACTOR, reason=reason)
        except rules.RuleViolation as exc:
            if exc.rule != "rollback-needs-previous":
                raise
            await session.rollback()
            # Nothing to return to: the version stops being active all the same.
            return await service.set_status(
                session,
                policy_id=row.policy_id,
                status=Status.RETIRED,
                actor=ACTOR,
                reason=f"{reason}; no earlier version to return to",
            )

    # -- links --------------------------------------------------------------------------------
    def _optimizer(self) -> admin_grpc.EndpointAdminServiceStub:
        if not self._links.optimizer_address:
            raise FailedPrecondition("no optimizer configured (set FLYWHEEL_TRAINER_OPTIMIZER_ADDRESS)")
        if self._admin is None:
            self._channel = aio_channel(self._links.optimizer_address, self._links.optimizer_tls)
            self._admin = admin_grpc.EndpointAdminServiceStub(self._channel)
        return self._admin

    async def _get_endpoint(self, admin: admin_grpc.EndpointAdminServiceStub, name: str) -> ep_pb.Endpoint | None:
        """The endpoint, or None if the optimizer says it does not exist."""
        try:
            got = await admin.GetEndpoint(
                admin_pb.GetEndpointRequest(name=name), timeout=self._links.optimizer_timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise Unavailable(f"optimizer GetEndpoint {name!r}: {exc.code().name}: {exc.details()}") from None
        return got.endpoint

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            root = self._links.modelserver_url.rstrip("/").removesuffix("/v1")
            key = self._links.modelserver_api_key
            self._http = httpx.AsyncClient(
                base_url=root,
                headers={"Authorization": f"Bearer {key}"} if key else {},
                timeout=self._links.modelserver_timeout_s,
            )
        return self._http


def _error_body(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _error_code(resp: httpx.Response) -> str:
    return str(_error_body(resp).get("code") or "")


def _error_message(resp: httpx.Response) -> str:
    return str(_error_body(resp).get("message") or resp.text[:500])
