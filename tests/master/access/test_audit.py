"""The audit trail as the services write it: one record per change, with its user, action, objects and
reason, in the change's own transaction (a refused change leaves none)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from common.errors import FleetshardError, Refused
from common.models import Host, Label
from master import services
from master.access.audit import record
from master.api.filters import parse_since
from master.models import AuditRecord


def targets(entry: AuditRecord) -> list[tuple[str, str]]:
    return [(t.kind, t.name) for t in entry.targets.order_by("id")]


def last() -> AuditRecord:
    return AuditRecord.objects.order_by("-id").first()  # type: ignore[return-value]


@pytest.fixture
def op(db: None) -> User:
    return User.objects.create_user("op")


def test_a_lock_records_the_user_the_hosts_and_the_reason(fleet, op):
    before = AuditRecord.objects.count()
    services.lock_hosts(["a1", "a2"], "flaky usb hub", acting_user=op)
    assert AuditRecord.objects.count() == before + 1
    entry = last()
    assert (entry.user, entry.actor, entry.action, entry.reason) == (op, "op", "host.lock", "flaky usb hub")
    assert targets(entry) == [("host", "a1"), ("host", "a2")]
    assert entry.targets.get(name="a1").object_id == Host.objects.get(hostname="a1").id


def test_the_system_is_recorded_as_system(fleet):
    services.unlock_hosts(["a1"], acting_user=None)
    entry = last()
    assert (entry.user, entry.actor, entry.action, targets(entry)) == (None, "system", "host.unlock", [("host", "a1")])


def test_every_change_names_its_action_and_objects(fleet, op):
    """One record for each service, each naming what it touched (the fleet fixture made its own)."""
    AuditRecord.objects.all().delete()
    services.create_labels(["os:x"], acting_user=op)
    services.create_hosts(["n1"], acting_user=op, labels=["board:a"], locked=True, lock_reason="new, not wired")
    services.add_label_to_hosts("os:x", ["n1"], acting_user=op)
    services.remove_label_from_hosts("os:x", ["n1"], acting_user=op)
    _, _ = services.create_shard("lab3", ["board:c"], acting_user=op)
    services.add_labels_to_shard("lab3", ["pool:x"], acting_user=op)
    services.remove_label_from_shard("lab3", "pool:x", acting_user=op)
    job = services.create_job(
        services.JobRequest(name="j", owner="op", command="true", meta_hosts=[("board:a", 1)]), acting_user=op
    )
    services.abort_jobs([job.id], acting_user=op)
    token, _ = services.create_shard_token("lab3", acting_user=op)
    services.revoke_token(token.id, acting_user=op)
    personal, _ = services.create_personal_token("newbie", acting_user=op)
    services.delete_hosts(["c1"], acting_user=op)
    services.delete_labels(["os:x"], acting_user=op)
    services.delete_shards(["lab3"], acting_user=op)
    got = [(e.action, targets(e)) for e in AuditRecord.objects.order_by("id")]
    shard_token = [t for e in AuditRecord.objects.filter(action="shard.create") for t in targets(e) if t[0] == "token"]
    assert got == [
        ("label.create", [("label", "os:x")]),
        ("host.create", [("host", "n1"), ("label", "board:a")]),
        ("host.add_label", [("label", "os:x"), ("host", "n1")]),
        ("host.remove_label", [("label", "os:x"), ("host", "n1")]),
        ("shard.create", [("shard", "lab3"), ("label", "board:c"), ("host", "c1"), *shard_token]),
        ("shard.add_labels", [("shard", "lab3"), ("label", "pool:x")]),
        ("shard.remove_label", [("shard", "lab3"), ("label", "pool:x")]),
        ("job.create", [("job", "j"), ("shard", "lab1")]),
        ("job.abort", [("job", "j")]),
        ("token.create", [("token", token.prefix), ("shard", "lab3")]),
        ("token.revoke", [("token", token.prefix), ("shard", "lab3")]),
        ("token.create", [("token", personal.prefix), ("user", "newbie")]),
        ("host.delete", [("host", "c1")]),
        ("label.delete", [("label", "os:x")]),
        ("shard.delete", [("shard", "lab3")]),
    ]
    assert {e.actor for e in AuditRecord.objects.all()} == {"op"}
    assert AuditRecord.objects.get(action="host.create").reason == "new, not wired"


def test_moves_and_aborted_jobs_are_in_the_details(fleet, op):
    job = fleet.job()
    deletion = services.delete_shards(["lab1"], acting_user=op)
    entry = last()
    assert entry.action == "shard.delete"
    assert entry.details["jobs_aborted"] == [job.id] == deletion.aborted_job_ids
    assert entry.details["hosts_moved"] == [{"host": h, "from": "lab1", "to": None} for h in ("a1", "a2", "a3")]
    assert targets(entry) == [("shard", "lab1"), ("host", "a1"), ("host", "a2"), ("host", "a3"), ("job", "smoke")]


def test_a_refused_change_writes_no_record(fleet, op):
    before = list(AuditRecord.objects.values_list("id", flat=True))
    with pytest.raises(Refused, match="label board:b already belongs to shard lab2"):
        services.add_labels_to_shard("lab1", ["wifi", "board:b"], acting_user=op)
    with pytest.raises(Refused, match="would have labels of two shards"):
        services.add_label_to_hosts("board:b", ["a1"], acting_user=op)
    with pytest.raises(FleetshardError, match="invalid host name"):
        services.create_hosts(["bad/name"], acting_user=op)
    assert list(AuditRecord.objects.values_list("id", flat=True)) == before
    assert Label.objects.get(name="wifi").shard is None


def test_a_failure_after_the_record_rolls_the_record_back(fleet, op):
    """The record is part of the change: when the transaction around both fails, neither stays."""
    from django.db import transaction

    before = AuditRecord.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.lock_hosts(["a1"], "x", acting_user=op)
        raise RuntimeError("the caller's transaction fails")
    assert AuditRecord.objects.count() == before and not Host.objects.get(hostname="a1").locked


def test_the_heartbeat_writes_no_record(fleet, heartbeat):
    """A shard's reports (host statuses, job progress) are the system's bookkeeping, not a person's change."""
    job = fleet.job()
    hqe = job.hqes.get()
    a1 = Host.objects.get(hostname="a1")
    before = AuditRecord.objects.count()
    first = heartbeat(fleet.lab1, fleet.token1)
    hosts = [{"id": h["id"], "version": h["version"], "status": "Running"} for h in first["hosts"]]
    running = {"seq": 1, "hqe": hqe.id, "job": job.id, "status": "Running", "host": a1.id}
    resp = heartbeat(fleet.lab1, fleet.token1, known_hosts=hosts, updates=[running])
    assert resp["acks"] == [{"seq": 1, "result": "accepted"}]
    hqe.refresh_from_db()
    assert hqe.status == "Running" and Host.objects.get(id=a1.id).status == "Running"
    assert AuditRecord.objects.count() == before


def test_record_refuses_an_action_that_is_not_topic_verb(db):
    with pytest.raises(ValueError, match="is not TOPIC.VERB"):
        record("lock", acting_user=None)
    assert not AuditRecord.objects.exists()


@pytest.mark.parametrize("hosts", [1, 100])
def test_adding_labels_to_a_shard_costs_the_same_queries_for_1_or_100_hosts(db, django_assert_num_queries, hosts):
    services.create_labels(["board:z", "pool:z"], acting_user=None)
    services.create_shard("labz", acting_user=None)
    services.create_hosts([f"z{i}" for i in range(hosts)], acting_user=None, labels=["board:z", "pool:z"])
    # Savepoint and release; the shard and the labels, locked; the labels' update; the hosts, locked;
    # their labels; one update per shard they join; the audit record and its targets. (No query for
    # the names of the shards they leave: they had none.)
    with django_assert_num_queries(10):
        change = services.add_labels_to_shard("labz", ["board:z", "pool:z"], acting_user=None)
    assert len(change.moves) == hosts and Host.objects.filter(shard__hostname="labz").count() == hosts
    assert last().details["hosts_moved"][0] == {"host": "z0", "from": None, "to": "labz"}


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("90m", timedelta(minutes=90)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        ("30s", timedelta(30 / 86400)),
    ],
)
def test_since_takes_an_age(text, ago):
    now = timezone.now()
    assert parse_since(text, now) == now - ago


def test_since_takes_an_iso_time_naive_meaning_utc():
    now = timezone.now()
    assert parse_since("2026-11-23T04:00:00Z", now).isoformat() == "2026-11-23T04:00:00+00:00"
    assert parse_since("2026-11-23 04:00", now).isoformat() == "2026-11-23T04:00:00+00:00"
    assert parse_since("2026-11-23T06:00:00+02:00", now).isoformat() == "2026-11-23T06:00:00+02:00"


@pytest.mark.parametrize("text", ["yesterday", "7 d", "-3h", "2026-13-01T00:00", "1y", ""])
def test_since_refuses_what_it_cannot_read(text):
    with pytest.raises(FleetshardError, match="invalid since .*: use an ISO time"):
        parse_since(text, timezone.now())


@pytest.mark.parametrize("text", ["999999w", "999999d", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_since_refuses_a_time_outside_the_calendar(text):
    """An age reaching before year 1, or an ISO time that has no UTC time, is the caller's mistake, not a 500."""
    with pytest.raises(
        FleetshardError, match=re.escape(f"invalid since {text!r}: it is before year 1 or after year 9999")
    ):
        parse_since(text, timezone.now())
