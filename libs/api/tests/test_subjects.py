"""flywheel.api.subjects.Catalogue: the subject/stream/consumer contract JetStream must accept."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest

from flywheel.api.subjects import Catalogue, Retention, subject_token

# Every subject method of the catalogue, with an example key.
SUBJECT_METHODS = {
    "decision": "optimizer.decision",
    "feedback": "product.feedback",
    "traces": "product.traces",
    "evaluation_request": "evaluator.request",
    "evaluation_result": "evaluator.result",
    "run_progress": "optimizer.run.progress",
    "society_proposal": "society.proposal",
    "society_dataset": "society.dataset",
    "training_job": "trainer.job",
    "training_progress": "trainer.progress",
    "policy_changed": "trainer.policy",
    "dataset_exported": "traces.dataset",
    "dead_letter": "deadletter",
}


# --- a tiny NATS wildcard matcher ------------------------------------------------------


def matches(pattern: str, subject: str) -> bool:
    """Does a concrete subject match a pattern with '*' (one token) and '>' (one or more, last)?"""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def covers(broad: str, narrow: str) -> bool:
    """Is every subject matched by the pattern ``narrow`` also matched by ``broad``?"""
    b, n = broad.split("."), narrow.split(".")
    for i, token in enumerate(b):
        if token == ">":
            return len(n) > i
        if i >= len(n) or n[i] == ">":
            return False
        if token != "*" and (n[i] == "*" or n[i] != token):
            return False
    return len(b) == len(n)


def overlaps(a: str, c: str) -> bool:
    """Could some subject match both patterns?"""
    x, y = a.split("."), c.split(".")
    for i in range(min(len(x), len(y))):
        if x[i] == ">" or y[i] == ">":
            return True
        if "*" not in (x[i], y[i]) and x[i] != y[i]:
            return False
    return len(x) == len(y)


def test_the_matcher_itself():
    assert matches("ns.a.>", "ns.a.b")
    assert matches("ns.a.>", "ns.a.b.c")
    assert not matches("ns.a.>", "ns.a")
    assert matches("ns.*.b", "ns.x.b")
    assert not matches("ns.*.b", "ns.x.y.b")
    assert not matches("ns.a.b", "ns.a.c")
    assert covers("ns.>", "ns.a.>")
    assert covers("ns.a.>", "ns.a.*")
    assert covers("ns.*.b", "ns.a.b")
    assert not covers("ns.a.>", "ns.>")
    assert not covers("ns.a.*", "ns.a.>")
    assert not covers("ns.a.b", "ns.a.*")
    assert not covers("ns.a.>", "ns.b.>")
    assert overlaps("ns.a.>", "ns.*.b")
    assert overlaps("ns.>", "ns.a")
    assert not overlaps("ns.a.>", "ns.b.>")
    assert not overlaps("ns.a", "ns.a.b")


# --- subjects ----------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["flywheel", "t0123abcd", "team-a"])
@pytest.mark.parametrize(("method", "middle"), SUBJECT_METHODS.items())
def test_subject_is_namespace_area_event_key(namespace, method, middle):
    subject = getattr(Catalogue(namespace), method)("KEY-1_x")
    assert subject == f"{namespace}.{middle}.KEY-1_x"


@pytest.mark.parametrize(("method", "middle"), SUBJECT_METHODS.items())
def test_every_subject_lands_in_exactly_one_stream(method, middle):
    catalogue = Catalogue()
    subject = getattr(catalogue, method)("key")
    homes = [s.name for s in catalogue.streams.values() if any(matches(p, subject) for p in s.subjects)]
    assert len(homes) == 1, f"{subject} is stored by {homes or 'no stream'}"


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "a*", "a>", "", "x" * 65, "tab\there", "ü"])
@pytest.mark.parametrize("method", SUBJECT_METHODS)
def test_a_key_that_is_not_one_token_raises(method, bad):
    with pytest.raises(ValueError, match="must be 1-64 chars"):
        getattr(Catalogue(), method)(bad)


def test_the_error_names_what_was_wrong():
    with pytest.raises(ValueError, match=r"endpoint 'support.bot'"):
        Catalogue().decision("support.bot")
    with pytest.raises(ValueError, match=r"consumer 'a b'"):
        Catalogue().dead_letter("a b")


def test_longest_valid_token_is_accepted():
    assert subject_token("x" * 64, what="key") == "x" * 64


def test_a_trailing_newline_is_not_a_token():
    with pytest.raises(ValueError, match="must be 1-64 chars"):
        Catalogue().decision("abc\n")


# --- streams and consumers ---------------------------------------------------------------


def test_stream_names_are_valid_jetstream_names():
    for name in Catalogue("team-a").streams:
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name), name


def test_stream_subjects_do_not_overlap():
    """JetStream refuses a stream whose subjects overlap another stream's."""
    catalogue = Catalogue()
    patterns = [(s.name, p) for s in catalogue.streams.values() for p in s.subjects]
    for (name_a, a), (name_b, b) in itertools.combinations(patterns, 2):
        assert not overlaps(a, b), f"{name_a} {a} overlaps {name_b} {b}"


def test_every_consumer_is_on_an_existing_stream_and_its_filter_is_covered():
    catalogue = Catalogue()
    assert catalogue.consumers
    for durable, spec in catalogue.consumers.items():
        assert spec.durable == durable
        assert spec.stream in catalogue.streams, f"{durable} names unknown stream {spec.stream}"
        stream = catalogue.streams[spec.stream]
        assert any(covers(p, spec.filter_subject) for p in stream.subjects), (
            f"{durable}: filter {spec.filter_subject} is outside {stream.subjects}"
        )


def test_work_queue_streams_have_at_most_one_consumer():
    """JetStream refuses overlapping consumers on a work-queue stream."""
    catalogue = Catalogue()
    per_stream = Counter(c.stream for c in catalogue.consumers.values())
    work_queues = [s for s in catalogue.streams.values() if s.retention is Retention.WORK_QUEUE]
    assert work_queues
    for stream in work_queues:
        assert per_stream[stream.name] <= 1, f"{stream.name} has {per_stream[stream.name]} consumers"


def test_consumer_limits_are_sane():
    for spec in Catalogue().consumers.values():
        assert spec.ack_wait.total_seconds() > 0
        assert spec.max_deliver >= 1
        assert spec.max_ack_pending >= 1
    # Trainer replicas share one durable: a cap of 1 would run one job in the whole cluster
    # (each replica limits itself to one job at a time instead).
    assert Catalogue().consumer("trainer-jobs").max_ack_pending > 1


def test_consumer_lookup_of_unknown_durable_raises():
    with pytest.raises(KeyError):
        Catalogue().consumer("no-such-consumer")


# --- namespaces ----------------------------------------------------------------------------


def _disjoint(a: Catalogue, b: Catalogue) -> None:
    assert not set(a.streams) & set(b.streams)
    for sa, sb in itertools.product(a.streams.values(), b.streams.values()):
        for pa, pb in itertools.product(sa.subjects, sb.subjects):
            assert not overlaps(pa, pb), f"{pa} overlaps {pb}"
    for method in SUBJECT_METHODS:
        assert getattr(a, method)("k") != getattr(b, method)("k")


def test_two_namespaces_have_disjoint_streams_and_subjects():
    _disjoint(Catalogue("flywheel"), Catalogue("t0123abcd"))
    _disjoint(Catalogue("flywheel"), Catalogue("flywheel2"))


def test_same_namespace_gives_the_same_catalogue():
    assert Catalogue("abc").streams == Catalogue("abc").streams
    assert Catalogue("abc").consumers == Catalogue("abc").consumers


def test_namespaces_cannot_collide_on_stream_names():
    # "-" becomes "_" in stream names, so "_" is not allowed in a namespace at all.
    with pytest.raises(ValueError, match="namespace 'team_a'"):
        Catalogue("team_a")
    _disjoint(Catalogue("team-a"), Catalogue("teama"))
