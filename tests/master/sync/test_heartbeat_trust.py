"""The heartbeat as a trust boundary: hostile values, other shards' hosts, and shard instances."""

import json
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from common.constants import OFFLINE_AFTER_INTERVALS
from common.models import Host, HostQueueEntry, Job, Shard
from master import services
from tests.master.sync.test_heartbeat import _snapshot, known, known_hosts, update
from tests.support import assert_status


def _silence(shard: Shard, intervals: float = OFFLINE_AFTER_INTERVALS + 0.5) -> None:
    """Makes the shard's last heartbeat `intervals` heartbeat intervals old."""
    ago = timedelta(seconds=intervals * settings.FLEETSHARD_HEARTBEAT_INTERVAL_S)
    Shard.objects.filter(id=shard.id).update(last_heartbeat=timezone.now() - ago)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda b: b.update(protocol=True), "protocol"),
        (lambda b: b.update(protocol=1.0), "protocol"),
        (lambda b: b.update(protocol="1"), "protocol"),
        (lambda b: b.update(client_version="0.1\x00"), "client_version"),
        (lambda b: b.update(client_version="\ud800"), "client_version"),
        (lambda b: b.update(shard="lab1\x00"), "shard"),
        (lambda b: b.pop("instance"), "instance"),
        (lambda b: b.update(instance="not-a-uuid"), "instance"),
        (lambda b: b.update(instance=["5f0c7a2e-8d1b-4c3e-9a77-2b6f1d0e4c11"]), "instance"),
        (lambda b: b.update(known_hosts=[{"id": 2**63, "version": 1, "status": "Ready"}]), "known_hosts[0].id"),
        (lambda b: b.update(known_jobs=[{"id": 1, "version": 0}]), "known_jobs[0].version"),
        (lambda b: b.update(known_jobs=[{"id": True, "version": 1}]), "known_jobs[0].id"),
        (lambda b: b.update(updates=[{"seq": 2**63, "hqe": 1, "status": "Running"}]), "updates[0].seq"),
        (lambda b: b.update(updates=[{"seq": "7", "hqe": 1, "status": "Running"}]), "updates[0].seq"),
        (lambda b: b.update(updates=[7]), "updates[0]"),
        (lambda b: b.update(known_hosts={"id": 1}), "known_hosts"),
        (lambda b: b.update(padding=json.loads("[" * 33 + "]" * 33)), "body"),
        (lambda b: b.update(last_seq=-1), "last_seq"),
        (lambda b: b.update(last_seq="7"), "last_seq"),
        (lambda b: b.update(last_seq=2**63), "last_seq"),
        (lambda b: b.update(last_seq=6, updates=[{"seq": 7, "hqe": 1, "status": "Running"}]), "last_seq"),
    ],
)
def test_hostile_envelope_is_a_400_naming_the_field_and_changes_nothing(fleet, heartbeat, change, field):
    hqe = fleet.job().hqes.get()
    body = heartbeat.body(fleet.lab1, updates=[update(1, hqe, "Running")])
    change(body)
    before = _snapshot()
    resp = heartbeat.post_raw(json.dumps(body), fleet.token1)
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == field
    assert field in resp.json()["error"]
    assert _snapshot() == before


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "above, where",
    [
        (3, lambda deep: {"known_hosts": [{"id": 1, "version": 1, "status": "Ready", "note": deep}]}),
        (2, lambda deep: {"known_jobs": [{"id": 1, "version": 1}, deep]}),
        (3, lambda deep: {"known_hosts": [{"id": 1, "version": 1, "status": "Ready"}], "updates": [{"x": deep}]}),
    ],
    ids=["in a known record's extra field", "as a known record", "beside plain known lists"],
)
def test_nesting_deeper_than_32_anywhere_is_a_400_and_32_is_not(fleet, heartbeat, above, where):
    """The body is level 1 and `above` levels hold the nested lists: too deep wherever it is, the known
    lists (checked in bulk) included."""
    before = _snapshot()
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, **where(_nested(33 - above)))), fleet.token1)
    assert_status(resp, 400)
    assert "nested deeper than 32" in resp.json()["error"], resp.content
    assert _snapshot() == before
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, **where(_nested(32 - above)))), fleet.token1)
    assert "nested deeper" not in resp.content.decode(), resp.content


def test_json_nested_100000_deep_is_a_400(fleet, heartbeat):
    before = _snapshot()
    for raw in (DEEP, '{"protocol": 1, "x": ' + DEEP + "}"):
        resp = heartbeat.post_raw(raw, fleet.token1)
        assert_status(resp, 400)
        assert "nested deeper than 32" in resp.json()["error"]
    assert _snapshot() == before


@pytest.mark.parametrize(
    "extra, error",
    [
        ({"hqe": [1]}, "hqe: expected an integer"),
        ({"hqe": {"id": 1}}, "hqe: expected an integer"),
        ({"host": [3]}, "host: expected an integer"),
        ({"host": {"id": 3}}, "host: expected an integer"),
        ({"exit_code": 2**31}, "exit_code: expected an integer from -2147483648 to 2147483647"),
        ({"exit_code": -(2**31) - 1}, "exit_code"),
        ({"started_on": "9999-12-31T23:59:59-23:59"}, "started_on: time '9999-12-31T23:59:59-23:59'"),
        ({"started_on": "1999-12-31T23:59:59Z"}, "not between 2000 and 2100"),
        ({"finished_on": "2026-13-45T00:00:00Z"}, "finished_on"),
        ({"started_on": "2026-11-22T10:00:00"}, "with a zone"),
        ({"log_tail": "a\x00b"}, "log_tail: contains NUL"),
        ({"log_tail": "a\udc80b"}, "log_tail: contains NUL or a lone surrogate"),
        ({"log_tail": ["x"]}, "log_tail: expected a string"),
        ({"status": None}, "status: expected one of"),
        ({"status": "Failed"}, "failure: a Failed update needs one of"),
        ({"job": "one"}, "job: expected an integer"),
    ],
)
def test_hostile_update_is_rejected_while_the_others_apply(fleet, heartbeat, extra, error):
    bad, good = fleet.job().hqes.get(), fleet.job().hqes.get()
    hostile = {**update(1, bad, "Running"), **extra}
    resp = heartbeat(fleet.lab1, fleet.token1, updates=[hostile, update(2, good, "Running")])
    assert resp["acks"][0]["result"] == "rejected" and error in resp["acks"][0]["error"], resp["acks"][0]
    assert resp["acks"][1] == {"seq": 2, "result": "accepted"}
    assert HostQueueEntry.objects.get(id=good.id).status == "Running"
    if isinstance(extra.get("hqe"), int | None):
        assert HostQueueEntry.objects.get(id=bad.id).status == "Queued"


def test_surrogate_escapes_in_the_raw_body_are_handled(fleet, heartbeat):
    hqe = fleet.job().hqes.get()
    body = json.dumps(heartbeat.body(fleet.lab1, updates=[update(1, hqe, "Running", log_tail="LT")]))
    resp = heartbeat.post_raw(body.replace('"LT"', '"\\ud800\\u0000"'), fleet.token1)
    assert_status(resp, 200)
    assert resp.json()["acks"][0]["result"] == "rejected"
    resp = heartbeat.post_raw(body.replace('"test"', '"\\udfff"'), fleet.token1)
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == "client_version"


# A shard touches only its own hosts.


def test_update_naming_another_shards_host_is_rejected_even_when_listed_as_known(fleet, heartbeat):
    hqe = fleet.job().hqes.get()
    b1 = Host.objects.get(hostname="b1")
    resp = heartbeat(
        fleet.lab1,
        fleet.token1,
        known_hosts=[{"id": b1.id, "version": b1.version, "status": "Running"}],
        updates=[update(1, hqe, "Running", host=b1.id)],
    )
    assert resp["acks"][0] == {"seq": 1, "result": "rejected", "error": f"host {b1.id} is not a host of shard lab1"}
    assert resp["removed_host_ids"] == [b1.id]
    hqe.refresh_from_db()
    b1.refresh_from_db()
    assert (hqe.status, hqe.host_id, b1.status) == ("Queued", None, "Ready")
    services.delete_hosts(["b1"], acting_user=None)


def test_a_shard_cannot_run_two_hqes_of_a_job_on_one_host(fleet, heartbeat):
    """A meta-host job's N HQEs run on N different hosts: a buggy or hostile shard that reports a
    second HQE of the job on a host another one already has used to be believed."""
    first, second, third = fleet.job(meta_hosts=[("board:a", 3)]).hqes.order_by("id")
    a1, a2 = Host.objects.get(hostname="a1"), Host.objects.get(hostname="a2")
    resp = heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[
            update(1, first, "Running", host=a1.id),
            update(2, second, "Running", host=a1.id),
            update(3, third, "Running", host=a2.id),
        ],
    )
    assert [a["result"] for a in resp["acks"]] == ["accepted", "rejected", "accepted"]
    assert "already" in resp["acks"][1]["error"] and f"host {a1.id}" in resp["acks"][1]["error"]
    resp = heartbeat(fleet.lab1, fleet.token1, updates=[update(4, second, "Completed", host=a2.id)])
    assert resp["acks"] == [{"seq": 4, "result": "accepted"}], "an end is never refused for its host"
    rows = dict(HostQueueEntry.objects.filter(job=first.job).values_list("id", "host_id"))
    assert rows == {first.id: a1.id, second.id: None, third.id: a2.id}


def test_an_hqes_end_is_never_refused_for_its_host(fleet, heartbeat):
    hqe = fleet.job().hqes.get()
    a1 = Host.objects.get(hostname="a1")
    b1 = Host.objects.get(hostname="b1")
    heartbeat(fleet.lab1, fleet.token1, updates=[update(1, hqe, "Running", host=a1.id)])
    resp = heartbeat(fleet.lab1, fleet.token1, updates=[update(2, hqe, "Failed", failure="test", host=b1.id)])
    assert resp["acks"] == [{"seq": 2, "result": "accepted"}]
    hqe.refresh_from_db()
    assert (hqe.status, hqe.host_id) == ("Failed", a1.id), "it ended, on the host it ran on"


def test_job_on_a_host_that_left_the_shard_can_still_be_aborted_and_the_host_deleted(fleet, heartbeat):
    services.create_labels(["pool:moving"], acting_user=None)
    services.add_labels_to_shard("lab1", ["pool:moving"], acting_user=None)
    services.create_hosts(["m1"], labels=["pool:moving"], acting_user=None)
    job = fleet.job(meta_hosts=[], hosts=["m1"])
    hqe = job.hqes.get()
    m1 = Host.objects.get(hostname="m1")
    first = heartbeat(fleet.lab1, fleet.token1)
    services.delete_labels(["pool:moving"], acting_user=None)
    services.abort_jobs([job.id], acting_user=None)
    resp = heartbeat(
        fleet.lab1,
        fleet.token1,
        known_hosts=known_hosts(first["hosts"]),
        known_jobs=known(first["jobs"]),
        updates=[update(1, hqe, "Aborted", host=m1.id)],
    )
    assert resp["acks"] == [{"seq": 1, "result": "accepted"}]
    assert m1.id in resp["removed_host_ids"]
    assert Job.objects.get(id=job.id).status == "Aborted"
    services.delete_hosts(["m1"], acting_user=None)


@pytest.mark.parametrize("lab2_knows", ["nothing", "its other hosts"])
def test_a_host_moved_while_running_a_job_reaches_its_new_shard_only_once_the_job_ends(fleet, heartbeat, lab2_knows):
    """A host moved to another shard (by its labels) while its old shard ran a job on it used to be
    sent to the new shard at once, as a Ready host of its own: two jobs on one device at a time. Both
    ways of reading what to send: every host of the shard (a cold sync) and some of them."""
    hqe = fleet.job(meta_hosts=[], hosts=["a1"]).hqes.get()
    a1 = Host.objects.get(hostname="a1")
    known = known_hosts(heartbeat(fleet.lab2, fleet.token2)["hosts"]) if lab2_knows != "nothing" else []
    heartbeat(fleet.lab1, fleet.token1, updates=[update(1, hqe, "Running", host=a1.id)])
    services.remove_label_from_hosts("board:a", ["a1"], acting_user=None)
    services.add_label_to_hosts("board:b", ["a1"], acting_user=None)
    assert Host.objects.get(id=a1.id).shard == fleet.lab2
    sent = heartbeat(fleet.lab2, fleet.token2, known_hosts=known)["hosts"]
    assert a1.id not in [h["id"] for h in sent] and len(sent) == (0 if known else 1)
    resp = heartbeat(fleet.lab1, fleet.token1, updates=[update(2, hqe, "Completed", exit_code=0)])
    assert resp["acks"] == [{"seq": 2, "result": "accepted"}]
    sent = heartbeat(fleet.lab2, fleet.token2, known_hosts=known)["hosts"]
    assert a1.id in [h["id"] for h in sent] and len(sent) == (1 if known else 2)


# Shard instances.

OTHER = str(uuid.uuid4())


def test_a_second_live_instance_is_refused_with_409_and_changes_nothing(fleet, heartbeat):
    hqe = fleet.job().hqes.get()
    heartbeat(fleet.lab1, fleet.token1)
    before = _snapshot()
    body = heartbeat.body(fleet.lab1, instance=OTHER, updates=[update(1, hqe, "Running")])
    resp = heartbeat.post_raw(json.dumps(body), fleet.token1)
    assert_status(resp, 409)
    assert resp.json()["detail"]["field"] == "instance"
    error = resp.json()["error"]
    assert "shard lab1 is running from another database" in error and " s ago" in error
    assert _snapshot() == before


def test_a_new_instance_takes_over_after_three_silent_intervals(fleet, heartbeat):
    running, queued = fleet.job("running").hqes.get(), fleet.job("queued").hqes.get()
    done = fleet.job("done", meta_hosts=[("board:a", 2)])
    done_hqes = list(done.hqes.order_by("id"))
    a1 = Host.objects.get(hostname="a1")
    first = heartbeat(fleet.lab1, fleet.token1)
    heartbeat(
        fleet.lab1,
        fleet.token1,
        known_hosts=known_hosts(first["hosts"]),
        known_jobs=known(first["jobs"]),
        updates=[
            update(40, running, "Running", host=a1.id),
            update(41, done_hqes[0], "Running", host=a1.id),
            update(42, done_hqes[0], "Completed", exit_code=0),
        ],
    )
    _silence(fleet.lab1)
    resp = heartbeat(fleet.lab1, fleet.token1, instance=OTHER)

    running.refresh_from_db()
    assert (running.status, running.failure) == ("Failed", "infra")
    assert "database was replaced" in running.log_tail
    assert Shard.objects.get(id=fleet.lab1.id).instance == OTHER
    # Everything is sent anew; what already ended says so, so the new database never runs it.
    sent = {j["id"]: j for j in resp["jobs"]}
    assert set(sent) == {queued.job_id, done.id}
    assert [h["status"] for h in sent[done.id]["hqes"]] == ["Completed", "Queued"]
    assert len(resp["hosts"]) == 3
    # Seqs count afresh: the new instance's first seq applies.
    resp = heartbeat(fleet.lab1, fleet.token1, instance=OTHER, updates=[update(1, queued, "Running", host=a1.id)])
    assert resp["acks"] == [{"seq": 1, "result": "accepted"}]
    # And the old instance, back while the new one is live, is refused.
    old = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1)), fleet.token1)
    assert_status(old, 409)


def test_a_copy_is_told_which_of_its_queued_jobs_ended_meanwhile(fleet, heartbeat):
    job = fleet.job()
    hqe = job.hqes.get()
    first = heartbeat(fleet.lab1, fleet.token1)
    heartbeat(fleet.lab1, fleet.token1, updates=[update(5, hqe, "Completed", exit_code=0)])
    _silence(fleet.lab1)
    copy = heartbeat(fleet.lab1, fleet.token1, instance=OTHER, known_jobs=known(first["jobs"]))
    assert [(j["id"], [h["status"] for h in j["hqes"]]) for j in copy["jobs"]] == [(job.id, ["Completed"])]


def test_a_shards_first_instance_is_taken_without_failing_anything(fleet, heartbeat):
    hqe = fleet.job().hqes.get()
    heartbeat(fleet.lab1, fleet.token1, updates=[update(1, hqe, "Running")])
    Shard.objects.filter(id=fleet.lab1.id).update(instance="")
    heartbeat(fleet.lab1, fleet.token1, instance=OTHER)
    hqe.refresh_from_db()
    assert hqe.status == "Running"
    assert Shard.objects.get(id=fleet.lab1.id).instance == OTHER


# A database restored in place from a backup keeps its instance id (its physical identity is the same);
# its seq counter gives it away.


def _sent_up_to_seq_42(fleet, heartbeat) -> tuple[dict, HostQueueEntry]:
    """The shard's instance has sent seqs up to 42 (its last update 41, a host event 42)."""
    hqe = fleet.job().hqes.get()
    a1 = Host.objects.get(hostname="a1")
    first = heartbeat(fleet.lab1, fleet.token1)
    event = {"seq": 42, "host": a1.id, "status": "Cleaning", "at": timezone.now().isoformat()}
    heartbeat(
        fleet.lab1,
        fleet.token1,
        known_hosts=known_hosts(first["hosts"]),
        updates=[update(40, hqe, "Running", host=a1.id), update(41, hqe, "Completed", exit_code=0)],
        host_events=[event],
        last_seq=42,
    )
    assert Shard.objects.get(id=fleet.lab1.id).seq_seen == 42
    return first, hqe


@pytest.mark.parametrize("with_updates", [False, True], ids=["quiet", "with updates"])
def test_a_database_gone_back_in_time_is_refused_with_409_and_changes_nothing(fleet, heartbeat, with_updates):
    first, hqe = _sent_up_to_seq_42(fleet, heartbeat)
    before = _snapshot()
    # The backup's outbox still holds the run's start, and its counter stands at 39.
    updates = [update(39, hqe, "Running")] if with_updates else []
    body = heartbeat.body(fleet.lab1, known_hosts=known_hosts(first["hosts"]), updates=updates, last_seq=39)
    resp = heartbeat.post_raw(json.dumps(body), fleet.token1)
    assert_status(resp, 409)
    assert resp.json()["detail"] == {"field": "last_seq", "seq_seen": 42}
    error = resp.json()["error"]
    assert "shard lab1's database went back in time: its last seq is 39" in error and "sent seq 42" in error
    assert _snapshot() == before


def test_the_same_body_sent_twice_is_not_taken_for_a_database_gone_back(fleet, heartbeat):
    """A lost answer: the shard sends its heartbeat again as it was."""
    hqe = fleet.job().hqes.get()
    body = heartbeat.body(fleet.lab1, updates=[update(7, hqe, "Running")], last_seq=7)
    for _ in range(2):
        assert_status(heartbeat.post_raw(json.dumps(body), fleet.token1), 200)
    assert Shard.objects.get(id=fleet.lab1.id).seq_seen == 7


def test_a_shard_that_does_not_say_its_last_seq_is_not_checked(fleet, heartbeat):
    """A shard older than the check sends no `last_seq`."""
    first, _ = _sent_up_to_seq_42(fleet, heartbeat)
    heartbeat(fleet.lab1, fleet.token1, known_hosts=known_hosts(first["hosts"]))


def test_the_instance_that_replaces_a_database_gone_back_counts_its_seqs_afresh(fleet, heartbeat):
    first, hqe = _sent_up_to_seq_42(fleet, heartbeat)
    _silence(fleet.lab1)
    resp = heartbeat(fleet.lab1, fleet.token1, instance=OTHER, known_jobs=known(first["jobs"]), last_seq=39)
    assert Shard.objects.get(id=fleet.lab1.id).seq_seen == 0
    # The job that ran after the backup is sent with its end, so the restored database never runs it again.
    assert [(j["id"], [h["status"] for h in j["hqes"]]) for j in resp["jobs"]] == [(hqe.job_id, ["Completed"])]
    heartbeat(fleet.lab1, fleet.token1, instance=OTHER, known_jobs=known(resp["jobs"]), last_seq=39)


def test_a_database_failure_mid_heartbeat_is_a_503_that_applied_nothing(fleet, heartbeat, monkeypatch):
    from django.db import OperationalError

    from master.sync import endpoint

    hqe = fleet.job().hqes.get()

    def lost(*args, **kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(endpoint, "process_heartbeat", lost)
    before = _snapshot()
    resp = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, updates=[update(1, hqe, "Running")])), fleet.token1)
    assert_status(resp, 503)
    assert "retry" in resp.json()["error"]
    assert _snapshot() == before
