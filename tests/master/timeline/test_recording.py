"""Intervals as the master records them: runs from the heartbeat's HQE updates, host states from
record_host_status; duplicates and reports out of time order never make overlapping intervals."""

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.constants import HostStatus
from common.errors import FleetshardError, NotFound
from common.models import Host, HostQueueEntry
from master.timeline.models import Interval, IntervalKind
from master.timeline.recording import record_host_status
from tests.master.sync.test_heartbeat import update
from tests.master.timeline.factories import T0, add_run, at, host

STARTED = "2026-11-23T00:00:10Z"
FINISHED = "2026-11-23T00:01:10Z"


def _runs():
    return list(Interval.objects.filter(kind=IntervalKind.RUN).values_list("hqe_id", "host_id", "start", "end"))


def test_heartbeat_opens_a_run_then_closes_it_and_a_resent_update_changes_nothing(fleet, heartbeat):
    job = fleet.job()
    hqe = HostQueueEntry.objects.get(job=job)
    a1 = host("a1")
    running = update(1, hqe, "Running", host=a1.id, started_on=STARTED)
    heartbeat(fleet.lab1, fleet.token1, updates=[running])
    assert _runs() == [(hqe.id, a1.id, at(10), None)]
    done = update(2, hqe, "Completed", exit_code=0, finished_on=FINISHED)
    heartbeat(fleet.lab1, fleet.token1, updates=[running, done])
    assert _runs() == [(hqe.id, a1.id, at(10), at(70))]
    acks = heartbeat(fleet.lab1, fleet.token1, updates=[running, done])["acks"]
    assert [a["result"] for a in acks] == ["accepted", "accepted"]
    assert _runs() == [(hqe.id, a1.id, at(10), at(70))]


def test_an_update_without_a_start_records_no_run(fleet, heartbeat):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    heartbeat(fleet.lab1, fleet.token1, updates=[update(1, hqe, "Aborted", finished_on=FINISHED)])
    assert _runs() == []


def test_a_run_ending_before_it_started_is_recorded_empty_not_negative(fleet, heartbeat):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    body = update(1, hqe, "Completed", host=host("a2").id, started_on=FINISHED, finished_on=STARTED, exit_code=0)
    heartbeat(fleet.lab1, fleet.token1, updates=[body])
    assert _runs() == [(hqe.id, host("a2").id, at(70), at(70))]


def test_a_replaced_shard_database_closes_its_open_runs(fleet, heartbeat):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    heartbeat(fleet.lab1, fleet.token1, updates=[update(1, hqe, "Running", host=host("a1").id, started_on=STARTED)])
    fleet.lab1.refresh_from_db()
    fleet.lab1.last_heartbeat -= timedelta(days=1)
    fleet.lab1.save(update_fields=["last_heartbeat"])
    heartbeat(fleet.lab1, fleet.token1, instance="00000000-0000-4000-8000-000000000001")
    (run,) = Interval.objects.filter(kind=IntervalKind.RUN)
    assert run.end is not None and run.end >= run.start
    assert run.end == HostQueueEntry.objects.get(id=hqe.id).finished_on


def test_a_replaced_shard_database_ends_its_hosts_open_states(fleet, heartbeat):
    """The new database sends no event for a status it holds unchanged: an open Repairing once stayed
    open for good, overlapping every later run of the host."""
    a1 = host("a1")
    heartbeat(fleet.lab1, fleet.token1, host_events=[event(1, a1.id, "Repairing", 0)])
    fleet.lab1.refresh_from_db()
    fleet.lab1.last_heartbeat -= timedelta(days=1)
    fleet.lab1.save(update_fields=["last_heartbeat"])
    heartbeat(fleet.lab1, fleet.token1, instance="00000000-0000-4000-8000-000000000001")
    ((kind, start, end),) = _states()
    assert (kind, start) == ("Repairing", at(0)) and end is not None and end > at(0)


def _states(name="a1"):
    return list(Interval.objects.filter(host__hostname=name).order_by("start").values_list("kind", "start", "end"))


def test_host_states_open_and_close_and_duplicates_change_nothing(fleet):
    a1 = host("a1")
    opened = record_host_status(a1, HostStatus.CLEANING, at(0), shard=fleet.lab1)
    assert record_host_status(a1, HostStatus.CLEANING, at(0), shard=fleet.lab1) == opened
    assert record_host_status(a1, HostStatus.CLEANING, at(5), shard=fleet.lab1) == opened
    record_host_status(a1, HostStatus.READY, at(30), shard=fleet.lab1)
    record_host_status(a1, HostStatus.READY, at(30), shard=fleet.lab1)
    record_host_status(a1, HostStatus.REPAIRING, at(40), shard=fleet.lab1)
    record_host_status(a1, HostStatus.REPAIR_FAILED, at(50), shard=fleet.lab1)
    assert _states() == [
        ("Cleaning", at(0), at(30)),
        ("Repairing", at(40), at(50)),
        ("Repair Failed", at(50), None),
    ]
    assert Interval.objects.get(kind="Cleaning").shard == fleet.lab1


def test_a_report_older_than_the_last_fills_in_before_it(fleet):
    a1 = host("a1")
    record_host_status(a1, HostStatus.REPAIRING, at(10), shard=fleet.lab1)
    record_host_status(a1, HostStatus.CLEANING, at(5), shard=fleet.lab1)
    assert _states() == [("Cleaning", at(5), at(10)), ("Repairing", at(10), None)]
    record_host_status(a1, HostStatus.READY, at(20), shard=fleet.lab1)
    record_host_status(a1, HostStatus.REPAIR_FAILED, at(15), shard=fleet.lab1)
    assert _states() == [("Cleaning", at(5), at(10)), ("Repairing", at(10), at(15)), ("Repair Failed", at(15), at(20))]


def test_a_state_reported_during_a_run_starts_when_the_run_ends(fleet):
    add_run("a1", 0, 60)
    record_host_status(host("a1"), HostStatus.CLEANING, at(59), shard=fleet.lab1)
    assert _states() == [("run", at(0), at(60)), ("Cleaning", at(60), None)]
    add_run("a2", 0, None)
    assert record_host_status(host("a2"), HostStatus.CLEANING, at(30), shard=fleet.lab1) is None
    assert _states("a2") == [("run", at(0), None)]


def test_bad_reports_are_refused_and_change_nothing(fleet):
    with pytest.raises(FleetshardError, match="unknown host status 'Busy'"):
        record_host_status(host("a1"), "Busy", at(0), shard=fleet.lab1)
    with pytest.raises(FleetshardError, match="needs a time zone"):
        record_host_status(host("a1"), HostStatus.CLEANING, at(0).replace(tzinfo=None), shard=fleet.lab1)
    with pytest.raises(NotFound, match="unknown host 999999"):
        record_host_status(999999, HostStatus.CLEANING, at(0), shard=None)
    assert not Interval.objects.exists()


def _no_partial_overlaps(rows):
    """Sorted intervals of one host, as a viewer nests them: each ends within the one it starts in."""
    stack = []
    for _, start, end in sorted(rows, key=lambda r: (r[1], -(r[2] or at(10**6)).timestamp())):
        end = end or at(10**6)
        while stack and stack[-1] <= start:
            stack.pop()
        assert not stack or end <= stack[-1], rows
        stack.append(end)


REPORTS = st.lists(
    st.tuples(st.sampled_from(HostStatus.ALL), st.integers(min_value=0, max_value=40)), min_size=1, max_size=12
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=REPORTS, with_run=st.booleans())
def test_reports_in_any_order_leave_no_overlaps_and_a_repeated_report_changes_nothing(fleet, reports, with_run):
    Interval.objects.all().delete()
    if with_run:
        add_run("a1", 12, 18)
    a1 = host("a1")
    for status, second in reports:
        record_host_status(a1, status, T0 + timedelta(seconds=second), shard=fleet.lab1)
        before = _states()
        record_host_status(a1, status, T0 + timedelta(seconds=second), shard=fleet.lab1)
        assert _states() == before
    _no_partial_overlaps(_states())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=REPORTS)
def test_an_outbox_resent_from_its_start_changes_nothing(fleet, reports):
    """The outbox sends a host's reports in time order and may resend them after an outage."""
    Interval.objects.all().delete()
    a1 = host("a1")
    ordered = sorted(reports, key=lambda r: r[1])
    for status, second in ordered:
        record_host_status(a1, status, T0 + timedelta(seconds=second), shard=fleet.lab1)
    first = _states()
    for status, second in ordered:
        record_host_status(a1, status, T0 + timedelta(seconds=second), shard=fleet.lab1)
    assert _states() == first
    _no_partial_overlaps(first)


def event(seq, host_id, status, second):
    return {"seq": seq, "host": host_id, "status": status, "at": at(second).isoformat().replace("+00:00", "Z")}


def test_host_events_in_a_heartbeat_become_intervals_and_a_resent_heartbeat_changes_nothing(fleet, heartbeat):
    a1, a2 = host("a1"), host("a2")
    events = [
        event(1, a1.id, "Cleaning", 0),
        event(2, a2.id, "Repairing", 3),
        event(3, a1.id, "Ready", 30),
        event(4, a2.id, "Repair Failed", 40),
    ]
    acks = heartbeat(fleet.lab1, fleet.token1, host_events=events)["acks"]
    assert acks == [{"seq": s, "result": "accepted"} for s in (1, 2, 3, 4)]
    assert _states("a1") == [("Cleaning", at(0), at(30))]
    assert _states("a2") == [("Repairing", at(3), at(40)), ("Repair Failed", at(40), None)]
    assert heartbeat(fleet.lab1, fleet.token1, host_events=events)["acks"] == acks
    assert _states("a1") == [("Cleaning", at(0), at(30))]
    assert _states("a2") == [("Repairing", at(3), at(40)), ("Repair Failed", at(40), None)]


def test_host_events_follow_the_runs_of_the_same_heartbeat_and_their_acks_follow_the_updates(fleet, heartbeat):
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    a1 = host("a1")
    updates = [update(1, hqe, "Running", host=a1.id, started_on=STARTED), update(3, hqe, "Failed", failure="test")]
    updates[1]["at"] = FINISHED
    events = [event(2, a1.id, "Running", 10), event(4, a1.id, "Repairing", 71), event(5, a1.id, "Ready", 90)]
    acks = heartbeat(fleet.lab1, fleet.token1, updates=updates, host_events=events)["acks"]
    assert [a["seq"] for a in acks] == [1, 3, 2, 4, 5]
    assert _states() == [("run", at(10), at(70)), ("Repairing", at(71), at(90))]
    assert HostQueueEntry.objects.get(id=hqe.id).finished_on == at(70), "an end without finished_on takes at"


def test_a_bad_host_event_is_rejected_alone_and_a_shared_seq_is_the_bodys_fault(fleet, heartbeat):
    a1, b1 = host("a1"), host("b1")
    events = [
        event(1, a1.id, "Cleaning", 0),
        event(2, b1.id, "Cleaning", 0),
        {"seq": 3, "host": a1.id, "status": "Busy", "at": "2026-11-23T00:00:01Z"},
        {"seq": 4, "host": a1.id, "status": "Ready"},
        {"seq": 5, "host": a1.id, "status": "Ready", "at": "2099-01-01T00:00:00Z"},
    ]
    acks = heartbeat(fleet.lab1, fleet.token1, host_events=events)["acks"]
    assert [a["result"] for a in acks] == ["accepted", "rejected", "rejected", "rejected", "rejected"]
    assert "more than a day ahead of the master's clock" in acks[4]["error"]
    assert f"host {b1.id} is not a host of shard lab1" in acks[1]["error"]
    assert acks[2]["error"].startswith("status: expected one of") and acks[3]["error"] == "at: required"
    assert _states("a1") == [("Cleaning", at(0), None)] and _states("b1") == []
    hqe = HostQueueEntry.objects.get(job=fleet.job())
    body = heartbeat(
        fleet.lab1, fleet.token1, 400, updates=[update(7, hqe, "Running")], host_events=[event(7, a1.id, "Ready", 9)]
    )
    assert body["detail"]["field"] == "host_events[0].seq" and "also an update's" in body["error"]
    assert heartbeat(
        fleet.lab1, fleet.token1, 400, host_events=[event(2, a1.id, "Ready", 9), event(2, a1.id, "Ready", 9)]
    )
    assert _states("a1") == [("Cleaning", at(0), None)] and HostQueueEntry.objects.get(id=hqe.id).status == "Queued"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=REPORTS, with_run=st.booleans())
def test_one_heartbeat_of_many_events_records_what_one_report_at_a_time_does(fleet, heartbeat, reports, with_run):
    """The heartbeat's bulk path and record_host_status are one algorithm: the same reports give the same intervals."""
    expected = []
    for bulk in (False, True):
        Interval.objects.all().delete()
        if with_run:
            add_run("a1", 12, 18)
        a1 = host("a1")
        if bulk:
            events = [event(n + 1, a1.id, status, second) for n, (status, second) in enumerate(reports)]
            heartbeat(fleet.lab1, fleet.token1, host_events=events)
            assert _states() == expected
        else:
            for status, second in reports:
                record_host_status(a1, status, T0 + timedelta(seconds=second), shard=fleet.lab1)
            expected = _states()


def test_a_heartbeat_of_a_thousand_events_on_a_thousand_hosts_is_recorded(fleet, heartbeat):
    """A full heartbeat of events on distinct hosts (a fleet-wide repair after an outage) is read in one
    query: SQLite once refused it (an expression a thousand ORs deep), wedging the shard's heartbeats."""
    hosts = Host.objects.bulk_create([Host(hostname=f"x{i}", shard=fleet.lab1) for i in range(1000)])
    events = [event(i + 1, h.id, "Repairing", i % 7) for i, h in enumerate(hosts)]
    acks = heartbeat(fleet.lab1, fleet.token1, host_events=events)["acks"]
    assert [a["result"] for a in acks] == ["accepted"] * 1000
    assert Interval.objects.filter(kind=IntervalKind.REPAIRING, end__isnull=True).count() == 1000
    events = [event(1001 + i, h.id, "Ready", 60) for i, h in enumerate(hosts)]
    heartbeat(fleet.lab1, fleet.token1, host_events=events)
    assert set(Interval.objects.values_list("end", flat=True)) == {at(60)}


def test_host_events_older_than_the_window_are_rejected_with_the_reason_and_touch_no_interval(
    fleet, heartbeat, settings
):
    """A shard whose clock started in 2001 (the wire refuses years before 2000) replays 999 events: each
    is refused with its reason, the host's history is unchanged, and an event inside the window is taken."""
    from datetime import UTC, datetime

    from django.utils import timezone

    settings.FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS = 7.0
    a1 = host("a1")
    now = timezone.now().replace(microsecond=0)
    for n in range(20):
        record_host_status(a1, HostStatus.CLEANING, now - timedelta(days=3, seconds=100 - n * 4), shard=fleet.lab1)
        record_host_status(a1, HostStatus.READY, now - timedelta(days=3, seconds=98 - n * 4), shard=fleet.lab1)
    before = _states()
    epoch = datetime(2001, 1, 1, tzinfo=UTC)
    stale = [
        {
            "seq": n + 1,
            "host": a1.id,
            "status": ("Cleaning", "Ready")[n % 2],
            "at": (epoch + timedelta(seconds=n)).isoformat(),
        }
        for n in range(999)
    ]
    fresh = now - timedelta(days=6)
    stale.append({"seq": 1000, "host": a1.id, "status": "Repairing", "at": fresh.isoformat()})
    acks = heartbeat(fleet.lab1, fleet.token1, host_events=stale)["acks"]
    assert [a["result"] for a in acks] == ["rejected"] * 999 + ["accepted"]
    assert acks[0]["error"] == "at: 2001-01-01T00:00:00Z is more than 7 days behind the master's clock"
    assert _states() == [("Repairing", fresh, before[0][1]), *before]


def test_a_shard_clock_stepping_back_closes_the_cleaning_it_left_open(fleet, heartbeat):
    """Cleaning at T, then the clock steps back an hour and the host is Ready: the shard never dates an
    event before the last one, so Ready ends the Cleaning (at T) instead of leaving it open for an hour."""
    from django.db import transaction
    from django.utils import timezone

    from shard.outbox import enqueue_host_event, pending_host_events

    a1 = host("a1")
    t = timezone.now().replace(microsecond=0)
    with transaction.atomic():
        enqueue_host_event(a1.id, "Cleaning", at=t)
    with transaction.atomic():
        enqueue_host_event(a1.id, "Ready", at=t - timedelta(hours=1))
    events = pending_host_events(10)
    assert [e["at"] for e in events] == [events[0]["at"]] * 2
    acks = heartbeat(fleet.lab1, fleet.token1, host_events=events)["acks"]
    assert [a["result"] for a in acks] == ["accepted", "accepted"]
    assert Interval.objects.filter(host=a1, end__isnull=True).count() == 0
    with transaction.atomic():
        enqueue_host_event(a1.id, "Repairing", at=t - timedelta(minutes=30))
    assert pending_host_events(10)[-1]["at"] == events[0]["at"], "the clock is still behind the last event"


def test_the_master_does_not_reorder_a_shards_events_by_seq(fleet, heartbeat):
    """Pinned (docs/protocol.md, "Host events"): a Ready dated before the open Cleaning, sent as is by a
    shard that does not keep its event times monotone, leaves the Cleaning open. The master cannot tell
    it from a resent duplicate (Cleaning 0-30, then Repairing from 40, resent: the Ready at 30 must
    not end the Repairing), so it keeps the time order the events say."""
    a1 = host("a1")
    heartbeat(fleet.lab1, fleet.token1, host_events=[event(1, a1.id, "Cleaning", 3600), event(2, a1.id, "Ready", 60)])
    assert _states() == [("Cleaning", at(3600), None)]
    Interval.objects.all().delete()
    events = [event(1, a1.id, "Cleaning", 0), event(2, a1.id, "Ready", 30), event(3, a1.id, "Repairing", 40)]
    heartbeat(fleet.lab1, fleet.token1, host_events=events)
    heartbeat(fleet.lab1, fleet.token1, host_events=events)
    assert _states() == [("Cleaning", at(0), at(30)), ("Repairing", at(40), None)]
