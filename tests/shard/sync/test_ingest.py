"""Applying a heartbeat response on the shard: master-owned fields only, idempotent, one transaction."""

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from common.models import Host, HostQueueEntry, Job
from common.wire import HeartbeatResponse
from shard.locks import shard_write
from shard.models import DeadLetter, HostEvent, HostState, OutboxEntry, ShardState
from shard.outbox import enqueue_host_event
from shard.services import finish_hqe, transition_hqe
from shard.sync.ingest import apply_response, known_hosts, known_jobs
from tests.shard.world import apply_wire


def host_wire(id: int = 12, version: int = 1, **kw: Any) -> dict[str, Any]:
    return {
        "id": id,
        "version": version,
        "hostname": kw.pop("hostname", f"dut{id}"),
        "labels": kw.pop("labels", ["board:pixel7"]),
        "locked": kw.pop("locked", False),
        "lock_reason": kw.pop("lock_reason", ""),
        "attributes": kw.pop("attributes", {"serial": "X1"}),
    }


def job_wire(id: int = 100, version: int = 1, **kw: Any) -> dict[str, Any]:
    return {
        "id": id,
        "version": version,
        "name": "smoke",
        "owner": "ana",
        "priority": 40,
        "command": "./run.sh",
        "timeout_mins": 1440,
        "max_runtime_mins": 60,
        "dependency_labels": ["board:pixel7"],
        "keyvals": {"build": "R120"},
        "parent_id": kw.pop("parent_id", None),
        "aborted": kw.pop("aborted", False),
        "created_on": "2026-11-22T09:59:00Z",
        "hqes": kw.pop("hqes", [{"id": id * 5, "host_id": None, "meta_host": "board:pixel7"}]),
    }


def response(**kw: Any) -> dict[str, Any]:
    return {
        "protocol": 1,
        "hosts": kw.get("hosts", []),
        "removed_host_ids": kw.get("removed_host_ids", []),
        "jobs": kw.get("jobs", []),
        "suite_keyvals": kw.get("suite_keyvals", {}),
        "acks": kw.get("acks", []),
        "more": False,
        "heartbeat_interval_s": 10,
    }


def snapshot() -> tuple[Any, ...]:
    return (
        list(Host.objects.order_by("id").values()),
        list(Job.objects.order_by("id").values()),
        list(HostQueueEntry.objects.order_by("id").values()),
        list(OutboxEntry.objects.values()),
    )


def test_response_creates_hosts_jobs_and_hqes_with_the_masters_ids(db):
    resp = response(hosts=[host_wire()], jobs=[job_wire(parent_id=7)], suite_keyvals={"7": {"suite": "bvt"}})
    apply_wire(resp)
    host = Host.objects.get(id=12)
    assert (host.hostname, host.status, host.attributes) == ("dut12", "Ready", {"serial": "X1"})
    assert [label.name for label in host.labels.all()] == ["board:pixel7"]
    job = Job.objects.get(id=100)
    assert (job.parent_id, job.suite_keyvals, job.keyvals) == (7, {"suite": "bvt"}, {"build": "R120"})
    assert job.hqes.get().id == 500 and job.hqes.get().meta_host.name == "board:pixel7"
    assert known_hosts() == [{"id": 12, "version": 1, "status": "Ready"}]
    assert known_jobs() == [{"id": 100, "version": 1}]
    assert ShardState.objects.get().last_heartbeat_ok is not None


def test_applying_the_same_response_twice_changes_nothing_more(db):
    resp = response(hosts=[host_wire()], jobs=[job_wire()])
    apply_wire(resp)
    first = snapshot()
    apply_wire(resp)
    assert snapshot() == first


def test_new_host_config_keeps_the_shards_own_status(db):
    apply_wire(response(hosts=[host_wire()]))
    Host.objects.filter(id=12).update(status="Repairing")
    apply_wire(response(hosts=[host_wire(version=2, locked=True, lock_reason="usb", labels=["board:x"])]))
    host = Host.objects.get(id=12)
    assert (host.locked, host.lock_reason, host.version, host.status) == (True, "usb", 2, "Repairing")
    assert [label.name for label in host.labels.all()] == ["board:x"]


def test_removed_idle_host_is_dropped(db):
    apply_wire(response(hosts=[host_wire(), host_wire(13)]))
    apply_wire(response(removed_host_ids=[13]))
    assert list(Host.objects.values_list("id", flat=True)) == [12]


def test_a_removed_host_without_its_state_row_is_dropped_not_kept_unretired(db):
    """The master says a removal once: a host with no HostState yet must not miss it (recovery would
    later give it a state, not retired, and schedule on a host the master took away)."""
    apply_wire(response(hosts=[host_wire(), host_wire(13)]))
    HostState.objects.filter(host_id=13).delete()
    apply_wire(response(removed_host_ids=[13, 99]))
    assert list(Host.objects.values_list("id", flat=True)) == [12]


def test_removed_busy_host_finishes_its_job_first(db):
    apply_wire(response(hosts=[host_wire()], jobs=[job_wire(hqes=[{"id": 500, "host_id": 12, "meta_host": None}])]))
    transition_hqe(500, "Running", host_id=12)
    apply_wire(response(removed_host_ids=[12]))
    assert HostState.objects.get(host_id=12).retired
    finish_hqe(500, "Completed", exit_code=0)
    apply_wire(response())
    assert not Host.objects.filter(id=12).exists()
    assert HostQueueEntry.objects.get(id=500).status == "Completed"


def test_acks_drop_updates_and_rejected_ones_are_dead_lettered(db):
    apply_wire(response(jobs=[job_wire(), job_wire(101)]))
    transition_hqe(500, "Running")
    transition_hqe(505, "Running")
    s1, s2 = OutboxEntry.objects.values_list("seq", flat=True)
    apply_wire(response(acks=[{"seq": s1, "result": "accepted"}, {"seq": s2, "result": "rejected", "error": "nope"}]))
    assert not OutboxEntry.objects.exists()
    letter = DeadLetter.objects.get()
    assert (letter.seq, letter.hqe_id, letter.error) == (s2, 505, "nope")


def test_aborted_job_cancels_its_queued_hqes_and_reports_them(db):
    apply_wire(response(jobs=[job_wire()]))
    apply_wire(response(jobs=[job_wire(version=2, aborted=True)]))
    hqe = HostQueueEntry.objects.get(id=500)
    assert hqe.status == "Aborted" and Job.objects.get(id=100).aborted
    assert OutboxEntry.objects.get().payload["status"] == "Aborted"


def test_known_jobs_keep_a_finished_job_until_its_final_update_is_acked(db):
    apply_wire(response(jobs=[job_wire()]))
    finish_hqe(500, "Completed", exit_code=0)
    assert known_jobs() == [{"id": 100, "version": 1}]
    seq = OutboxEntry.objects.get().seq
    apply_wire(response(acks=[{"seq": seq, "result": "accepted"}]))
    assert known_jobs() == []


def test_a_malformed_record_is_skipped_and_the_rest_applies(db):
    body = response(hosts=[host_wire(), {"id": 13, "hostname": "x"}], jobs=[job_wire(), {"id": 1}])
    parsed = HeartbeatResponse.parse(body)
    assert len(parsed.skipped) == 2 and "hosts[1]" in parsed.skipped[0] and "jobs[1]" in parsed.skipped[1]
    apply_response(parsed)
    assert list(Host.objects.values_list("id", flat=True)) == [12]
    assert list(Job.objects.values_list("id", flat=True)) == [100]


def test_hqes_the_master_says_ended_are_closed_here_without_an_update(db):
    apply_wire(response(jobs=[job_wire(hqes=[{"id": 500, "host_id": None, "meta_host": "board:pixel7"}])]))
    ended = [{"id": 500, "host_id": None, "meta_host": "board:pixel7", "status": "Completed"}]
    apply_wire(response(jobs=[job_wire(version=2, hqes=ended)]))
    assert HostQueueEntry.objects.get(id=500).status == "Completed"
    assert Job.objects.get(id=100).status == "Completed"
    assert not OutboxEntry.objects.exists()


def test_aborting_a_large_job_costs_the_same_queries_as_a_small_one(db):
    """150 HQEs: SQLite's parameter limit splits a bulk insert past about 200 rows (one more query each)."""
    counts = []
    for job_id, size in ((100, 1), (200, 150)):
        hqes = [{"id": job_id * 1000 + i, "host_id": None, "meta_host": "board:pixel7"} for i in range(size)]
        apply_wire(response(jobs=[job_wire(job_id, hqes=hqes)]))
        with CaptureQueriesContext(connection) as ctx:
            apply_wire(response(jobs=[job_wire(job_id, version=2, aborted=True, hqes=hqes)]))
        counts.append(len(ctx.captured_queries))
        assert set(HostQueueEntry.objects.filter(job_id=job_id).values_list("status", flat=True)) == {"Aborted"}
        assert OutboxEntry.objects.filter(job_id=job_id).count() == size
    assert counts[0] == counts[1], counts


def test_a_hostname_reused_twice_while_its_old_hosts_are_busy(db):
    """Host `a` deleted and re-created twice on the master while each old one still runs a job: the
    second retired `a` used to be renamed `a~retired` too, a unique-name clash that failed every
    heartbeat's ingest until the first finished."""
    name = "a" * 250  # `~retired` after it must still fit 255 characters (PostgreSQL enforces them)
    for host_id in (12, 13):
        hqe = {"id": host_id * 10, "host_id": host_id, "meta_host": None}
        apply_wire(response(hosts=[host_wire(host_id, hostname=name)], jobs=[job_wire(host_id * 10, hqes=[hqe])]))
        transition_hqe(host_id * 10, "Running", host_id=host_id)
        apply_wire(response(removed_host_ids=[host_id]))
    apply_wire(response(hosts=[host_wire(14, hostname=name)]))
    hosts = dict(Host.objects.values_list("id", "hostname"))
    assert hosts[14] == name
    assert len(set(hosts.values())) == 3 and all(len(h) <= 255 for h in hosts.values())
    assert HostState.objects.filter(retired=True).count() == 2


def test_a_record_the_database_refuses_costs_only_itself(db):
    """A (buggy or hostile) master's host named like another held host, or a job whose HQE id another
    job has, used to roll back the whole answer: every heartbeat failed and nothing else arrived."""
    apply_wire(response(hosts=[host_wire(12, hostname="dut")], jobs=[job_wire(100)]))
    clash = job_wire(101, hqes=[{"id": 500, "host_id": None, "meta_host": "board:pixel7"}])  # 500 is job 100's
    result = apply_wire(
        response(
            hosts=[host_wire(13, hostname="dut"), host_wire(14)],
            jobs=[clash, job_wire(102, aborted=True)],
            acks=[],
        )
    )
    assert result.hosts == 2
    assert sorted(Host.objects.values_list("id", flat=True)) == [12, 14]
    assert sorted(Job.objects.values_list("id", flat=True)) == [100, 102]
    assert HostQueueEntry.objects.get(id=500).job_id == 100
    assert HostQueueEntry.objects.get(id=510).status == "Aborted"
    # The refused job is not held, so the master sends it again.
    assert 101 not in [j["id"] for j in known_jobs()]


def test_every_host_gets_its_state_and_a_retired_host_sent_again_serves_again(db):
    apply_wire(response(hosts=[host_wire(), host_wire(13)], jobs=[job_wire(hqes=[{"id": 500, "host_id": 12}])]))
    assert list(HostState.objects.values_list("host_id", "runner", "retired")) == [(12, "", False), (13, "", False)]
    transition_hqe(500, "Running", host_id=12)
    HostState.objects.filter(host_id=12).update(runner="lab1:77:1")
    apply_wire(response(removed_host_ids=[12]))
    assert HostState.objects.get(host_id=12).retired

    apply_wire(response(hosts=[host_wire(version=2)]))

    assert list(HostState.objects.filter(host_id=12).values_list("runner", "retired")) == [("lab1:77:1", False)]


def test_the_shards_side_of_the_heartbeat_costs_pinned_queries(db, django_assert_num_queries):
    """New hosts, the same hosts changed, some removed: the states of an answer's hosts take one query."""

    def hosts(ids: range, version: int = 1) -> list[dict[str, Any]]:
        return [host_wire(i, version, labels=["board:a"], attributes={}) for i in ids]

    with django_assert_num_queries(26):
        apply_wire(response(hosts=hosts(range(1, 2))))
    with django_assert_num_queries(120):
        apply_wire(response(hosts=hosts(range(100, 110))))
    with django_assert_num_queries(90):
        apply_wire(response(hosts=hosts(range(100, 110), version=2)))
    with django_assert_num_queries(15):  # the removed hosts' ids are read: one may have no state yet
        apply_wire(response(removed_host_ids=[100, 101]))
    assert sorted(HostState.objects.values_list("host_id", flat=True)) == [1, *range(102, 110)]


def _host_events() -> list[int]:
    return list(HostEvent.objects.values_list("seq", flat=True))


def test_host_events_go_once_a_heartbeat_carrying_them_is_answered_acked_or_not(db):
    """A master without timelines never acks host events: they are dropped with the answer all the same,
    so the outbox never fills up with them; events the heartbeat did not carry stay."""

    with shard_write():
        seqs = [enqueue_host_event(12, status).seq for status in ("Cleaning", "Ready", "Repairing")]
    apply_wire({"acks": [{"seq": seqs[0], "result": "accepted"}]})
    assert _host_events() == seqs
    apply_response(HeartbeatResponse.parse({"protocol": 1, "acks": []}), sent_events=seqs[:2])
    assert _host_events() == seqs[2:]
    rejected = {"protocol": 1, "acks": [{"seq": seqs[2], "result": "rejected", "error": "host 12 is not yours"}]}
    apply_response(HeartbeatResponse.parse(rejected), sent_events=seqs[2:])
    assert _host_events() == [] and not DeadLetter.objects.exists()
