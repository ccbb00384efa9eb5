"""The one list of subjects, streams and durable consumers (a wire contract, like the
protos, so it lives here where products and services both import it).

Every subject is ``<namespace>.<area>.<event>[.<key>]``; the namespace defaults to
``flywheel`` and tests use a fresh one each so they can share one NATS server.
Retention follows the work: work queues for jobs and evaluation requests (each
message handed to one worker, removed once acked), interest for raw span batches (kept
only until the trace store has stored them, so erasing a user there leaves no copy on
the bus), and limits for facts that several services read (decisions, feedback,
progress). docs/bus.md renders this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
# No "_" in namespaces: stream names upper-case the namespace and turn "-" into "_".
NAMESPACE = re.compile(r"[a-z][a-z0-9-]{0,31}")


class Retention(StrEnum):
    LIMITS = "limits"
    WORK_QUEUE = "workqueue"
    # Kept until every durable consumer of the stream has acked; the consumers are declared
    # with the stream (`Catalogue.interest_consumers`), so nothing published is dropped for
    # want of a consumer before its service first starts.
    INTEREST = "interest"


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream: its subjects (wildcards), retention and limits."""

    name: str
    subjects: tuple[str, ...]
    retention: Retention
    description: str
    max_age: timedelta = timedelta(days=30)
    # Window in which a repeated Nats-Msg-Id is dropped by the server.
    duplicate_window: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer on a stream."""

    durable: str
    stream: str
    filter_subject: str
    description: str
    # Redelivery after this long without an ack (the handler died or hung).
    ack_wait: timedelta = timedelta(seconds=30)
    # After this many failed deliveries the message is dead-lettered.
    max_deliver: int = 5
    max_ack_pending: int = 10_000


def subject_token(value: str, *, what: str) -> str:
    """Check that a value can be one NATS subject token (no dots, spaces or wildcards)."""
    if not _TOKEN.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be 1-64 chars of [A-Za-z0-9_-]")
    return value


@dataclass(frozen=True)
class Catalogue:
    """Subjects, streams and consumers for one namespace."""

    namespace: str = "flywheel"
    streams: dict[str, StreamSpec] = field(init=False)
    consumers: dict[str, ConsumerSpec] = field(init=False)

    def __post_init__(self) -> None:
        ns = self.namespace
        if not NAMESPACE.fullmatch(ns):
            raise ValueError(f"namespace {ns!r} must match {NAMESPACE.pattern} (it prefixes subjects and streams)")
        p = re.sub(r"[^A-Z0-9]", "_", ns.upper())
        streams = [
            StreamSpec(
                f"{p}_DECISIONS",
                (f"{ns}.optimizer.decision.>",),
                Retention.LIMITS,
                "Every Select decision, with the probability of the chosen arm.",
            ),
            StreamSpec(
                f"{p}_FEEDBACK",
                (f"{ns}.product.feedback.>",),
                Retention.LIMITS,
                "Feedback products publish for decisions.",
            ),
            StreamSpec(
                f"{p}_TRACES",
                (f"{ns}.product.traces.>",),
                Retention.INTEREST,
                "Span batches from products and Flywheel's own services; removed once stored.",
            ),
            StreamSpec(
                f"{p}_EVALUATIONS",
                (f"{ns}.evaluator.request.>",),
                Retention.WORK_QUEUE,
                "Evaluation requests: one config on one test case; evaluators share it.",
            ),
            StreamSpec(
                f"{p}_EVALUATION_RESULTS",
                (f"{ns}.evaluator.result.>",),
                Retention.LIMITS,
                "Outcomes of evaluation requests.",
            ),
            StreamSpec(
                f"{p}_RUNS",
                (f"{ns}.optimizer.run.>",),
                Retention.LIMITS,
                "Batch run progress, one event per generation.",
            ),
            StreamSpec(
                f"{p}_SOCIETY",
                (f"{ns}.society.>",),
                Retention.LIMITS,
                "Society proposals and synthetic dataset updates.",
            ),
            StreamSpec(
                f"{p}_TRAINING_JOBS",
                (f"{ns}.trainer.job.>",),
                Retention.WORK_QUEUE,
                "Training jobs; GPU trainer pods scale on this queue's lag.",
            ),
            StreamSpec(
                f"{p}_TRAINER_EVENTS",
                (f"{ns}.trainer.progress.>", f"{ns}.trainer.policy.>"),
                Retention.LIMITS,
                "Training progress and policy status changes.",
            ),
            StreamSpec(
                f"{p}_DATASETS", (f"{ns}.traces.dataset.>",), Retention.LIMITS, "Datasets exported by the trace store."
            ),
            StreamSpec(
                f"{p}_DEADLETTER",
                (f"{ns}.deadletter.>",),
                Retention.LIMITS,
                "Messages a consumer could not process, with the reason.",
                max_age=timedelta(days=90),
            ),
        ]
        s = {spec.name: spec for spec in streams}
        consumers = [
            ConsumerSpec(
                "optimizer-feedback",
                f"{p}_FEEDBACK",
                f"{ns}.product.feedback.>",
                "Applies feedback to arm posteriors, once per event id.",
            ),
            ConsumerSpec(
                "trace-store-decisions",
                f"{p}_DECISIONS",
                f"{ns}.optimizer.decision.>",
                "Records decisions for joins and off-policy evaluation.",
            ),
            ConsumerSpec(
                "trace-store-feedback",
                f"{p}_FEEDBACK",
                f"{ns}.product.feedback.>",
                "Records feedback next to its decision.",
            ),
            ConsumerSpec("trace-store-traces", f"{p}_TRACES", f"{ns}.product.traces.>", "Stores span batches."),
            ConsumerSpec(
                "evaluator-requests",
                f"{p}_EVALUATIONS",
                f"{ns}.evaluator.request.>",
                "Runs evaluation requests; replicas share this consumer.",
                # Evaluators mark long calls in progress every ack_wait/3, so a crashed
                # replica's work comes back after 30 s however slow the target is.
                ack_wait=timedelta(seconds=30),
                # In flight at once per replica is bounded by its concurrency setting.
                max_ack_pending=1_000,
            ),
            ConsumerSpec(
                "optimizer-evaluation-results",
                f"{p}_EVALUATION_RESULTS",
                f"{ns}.evaluator.result.>",
                "Folds evaluation results into runs.",
            ),
            ConsumerSpec(
                "optimizer-proposals",
                f"{p}_SOCIETY",
                f"{ns}.society.proposal.>",
                "Injects proposed configs into the running generation of their run.",
            ),
            ConsumerSpec(
                "society-run-progress", f"{p}_RUNS", f"{ns}.optimizer.run.>", "Watches runs to propose candidates."
            ),
            ConsumerSpec(
                "trainer-jobs",
                f"{p}_TRAINING_JOBS",
                f"{ns}.trainer.job.>",
                "Runs training jobs; one job per GPU pod at a time.",
                # Trainers mark their job in progress every ack_wait/3; a dead pod's job comes
                # back after ack_wait and resumes from its last checkpoint in S3.
                ack_wait=timedelta(minutes=30),
                # Replicas share this consumer: each pulls one job at a time (its own limit), so
                # this caps jobs in flight across all of them, not per pod.
                max_ack_pending=1_000,
                # A graceful stop (drain) hands the job back too; the trainer itself gives up
                # after FLYWHEEL_TRAINER_MAX_ATTEMPTS pick-ups by a replica that died.
                max_deliver=20,
            ),
        ]
        object.__setattr__(self, "streams", s)
        object.__setattr__(self, "consumers", {c.durable: c for c in consumers})

    # Subjects, one method per event so a typo is an AttributeError, not a lost message.
    def decision(self, endpoint: str) -> str:
        return f"{self.namespace}.optimizer.decision.{subject_token(endpoint, what='endpoint')}"

    def feedback(self, endpoint: str) -> str:
        return f"{self.namespace}.product.feedback.{subject_token(endpoint, what='endpoint')}"

    def peer_fold(self, replica: str) -> str:
        """Plain NATS, in no stream: an optimizer replica's provisional folds, for the others."""
        return f"{self.namespace}.optimizer.fold.{subject_token(replica, what='replica')}"

    def traces(self, agent: str) -> str:
        return f"{self.namespace}.product.traces.{subject_token(agent, what='agent')}"

    def evaluation_request(self, run_id: str) -> str:
        return f"{self.namespace}.evaluator.request.{subject_token(run_id, what='run_id')}"

    def evaluation_result(self, run_id: str) -> str:
        return f"{self.namespace}.evaluator.result.{subject_token(run_id, what='run_id')}"

    def run_progress(self, run_id: str) -> str:
        return f"{self.namespace}.optimizer.run.progress.{subject_token(run_id, what='run_id')}"

    def society_proposal(self, run_id: str) -> str:
        return f"{self.namespace}.society.proposal.{subject_token(run_id, what='run_id')}"

    def society_dataset(self, dataset: str) -> str:
        return f"{self.namespace}.society.dataset.{subject_token(dataset, what='dataset')}"

    def training_job(self, kind: str) -> str:
        return f"{self.namespace}.trainer.job.{subject_token(kind, what='kind')}"

    def training_progress(self, job_id: str) -> str:
        return f"{self.namespace}.trainer.progress.{subject_token(job_id, what='job_id')}"

    def policy_changed(self, name: str) -> str:
        return f"{self.namespace}.trainer.policy.{subject_token(name, what='policy name')}"

    def dataset_exported(self, kind: str) -> str:
        return f"{self.namespace}.traces.dataset.{subject_token(kind, what='kind')}"

    def dead_letter(self, durable: str) -> str:
        """Dead letters are keyed by the consumer that rejected them."""
        return f"{self.namespace}.deadletter.{subject_token(durable, what='consumer')}"

    def consumer(self, durable: str) -> ConsumerSpec:
        return self.consumers[durable]

    def interest_consumers(self) -> list[ConsumerSpec]:
        """The consumers of interest-retention streams: declared together with the streams,
        because such a stream drops a message that no consumer is bound to receive."""
        interest = {name for name, spec in self.streams.items() if spec.retention is Retention.INTEREST}
        return [c for c in self.consumers.values() if c.stream in interest]


# Catalogue subjects (method names) published on plain NATS, which no stream stores: hints between
# optimizer replicas that lose nothing when dropped (the commit's NOTIFY settles the same events).
UNSTORED = frozenset({"peer_fold"})


# -- Who may use the bus for what ------------------------------------------------------------------
# One NATS user per role, each allowed to publish only what it produces and to read only the
# durable consumers it owns. The local stack's nats-server config, docs/bus.md and the chart's
# permissions (`flywheel-stack nats-permissions`) are all generated from this table.

# The reply inbox of a product: the SDK (or any NATS client) keeps the NATS default, so a
# product's JetStream publish can receive its ack.
PRODUCT_INBOX = "_INBOX"


def service_inbox(service: str) -> str:
    """Reply-inbox prefix of a service's NATS connection. Each service has its own, so that
    no other user can be allowed to subscribe to the replies (and pulled messages) sent to it."""
    return f"_INBOX_{subject_token(service, what='service')}"


@dataclass(frozen=True)
class RoleSpec:
    """A NATS user's role: the catalogue subjects (method names) it publishes and the durable
    consumers it reads. ``unrestricted`` is the admin (stream setup, tests, operators' tools)."""

    name: str
    description: str
    produces: tuple[str, ...] = ()
    consumes: tuple[str, ...] = ()
    # Dead-letter sinks it writes besides its consumers' (the optimizer's decision log puts a
    # decision there that can never be written or published).
    dead_letters: tuple[str, ...] = ()
    # Catalogue subjects (method names) it also receives as they are published, on a plain
    # subscription without acks (the optimizer's provisional folds of feedback, its own and
    # its peers'): read-only.
    watches: tuple[str, ...] = ()
    # Services declare every stream at startup (infra.connect_bus), so they need the stream
    # management API; a product does not.
    declares_topology: bool = False
    uses_bus: bool = True
    unrestricted: bool = False

    @property
    def inbox(self) -> str:
        return PRODUCT_INBOX if self.name == "product" else service_inbox(self.name)


ROLES: dict[str, RoleSpec] = {
    r.name: r
    for r in (
        RoleSpec(
            "optimizer",
            "Serves Select/Update, applies feedback, drives batch runs.",
            produces=("decision", "evaluation_request", "run_progress", "peer_fold"),
            dead_letters=("optimizer-decision-log",),
            consumes=("optimizer-feedback", "optimizer-evaluation-results", "optimizer-proposals"),
            watches=("feedback", "peer_fold"),
            declares_topology=True,
        ),
        RoleSpec(
            "evaluator",
            "Runs evaluation requests and publishes their results and traces.",
            produces=("evaluation_result", "traces"),
            consumes=("evaluator-requests",),
            declares_topology=True,
        ),
        RoleSpec(
            "trace_store",
            "Stores decisions, feedback and spans; exports datasets.",
            produces=("dataset_exported",),
            consumes=("trace-store-decisions", "trace-store-feedback", "trace-store-traces"),
            declares_topology=True,
        ),
        RoleSpec(
            "society",
            "Watches runs and proposes candidates and synthetic datasets.",
            produces=("society_proposal", "society_dataset"),
            consumes=("society-run-progress",),
            declares_topology=True,
        ),
        RoleSpec(
            "trainer",
            "Queues training jobs (SubmitJob), runs them, reports progress and policy changes.",
            produces=("training_job", "training_progress", "policy_changed"),
            consumes=("trainer-jobs",),
            declares_topology=True,
        ),
        RoleSpec("reward_judge", "Scores outputs over gRPC; never connects to NATS.", uses_bus=False),
        RoleSpec(
            "product",
            "A product using the SDK: publishes feedback and spans, reads nothing.",
            produces=("feedback", "traces"),
        ),
        RoleSpec(
            "admin",
            "Stream setup, tests and operators' tools (publishing training jobs, replaying dead letters).",
            unrestricted=True,
        ),
    )
}


@dataclass(frozen=True)
class Permissions:
    """NATS publish/subscribe allow-lists of one user (everything else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def role_permissions(role: str, namespace: str | None = "flywheel") -> Permissions | None:
    """The allow-lists of a role in one namespace, or in every namespace when ``namespace`` is
    None (the namespace token and the stream names become ``*``: what a server shared by
    tests with a fresh namespace each needs). None for the unrestricted admin; empty lists
    for a role that has no business on the bus."""
    spec = ROLES[role]
    if spec.unrestricted:
        return None
    if not spec.uses_bus:
        return Permissions((), ())
    cat = Catalogue(namespace or "flywheel")

    def subj(subject: str) -> str:
        return subject if namespace else "*" + subject[len(cat.namespace) :]

    def stream(name: str) -> str:
        return name if namespace else "*"

    def consumer_api(c: ConsumerSpec) -> list[str]:
        s, d = stream(c.stream), c.durable
        # nats-py creates a durable through DURABLE.CREATE; newer clients through CREATE with
        # the name (and the filter subject as extra tokens).
        return [
            f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.{d}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}.>",
            f"$JS.API.CONSUMER.INFO.{s}.{d}",
        ]

    publish: list[str] = []
    for method in spec.produces:
        # Every key is one token, so "*" in its place allows exactly that event's subjects.
        publish.append(subj(getattr(cat, method)("KEY").rsplit(".", 1)[0] + ".*"))
    if spec.declares_topology:
        for name in cat.streams:
            publish += [f"$JS.API.STREAM.{op}.{stream(name)}" for op in ("INFO", "CREATE", "UPDATE")]
        for c in cat.interest_consumers():
            publish += consumer_api(c)
    for durable in spec.consumes:
        c = cat.consumer(durable)
        publish += consumer_api(c)
        publish += [
            f"$JS.API.CONSUMER.MSG.NEXT.{stream(c.stream)}.{durable}",
            f"$JS.ACK.{stream(c.stream)}.{durable}.>",
            subj(cat.dead_letter(durable)),
        ]
    publish += [subj(cat.dead_letter(name)) for name in spec.dead_letters]
    subscribe = [f"{spec.inbox}.>"]
    subscribe += [subj(getattr(cat, method)("KEY").rsplit(".", 1)[0] + ".*") for method in spec.watches]
    return Permissions(tuple(dict.fromkeys(publish)), tuple(subscribe))
