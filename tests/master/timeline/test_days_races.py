"""Built days (master/timeline/days.py) under a second hostile review: writers whose changes the build
does not wait for, the builder's lock queueing writers, clocks, and `build_trace_days --once`. Each
export must say what a read of every interval says; writers must never wait for each other or a builder."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from common.models import HostQueueEntry, Job
from master.timeline import days
from master.timeline.export import trace_chunks
from master.timeline.models import Interval
from master.timeline.query import scope
from tests.master.timeline.days_support import assert_same, in_thread
from tests.master.timeline.factories import add_run
from tests.master.timeline.test_days_edges import day, t


def _waiting_for_a_lock(table: str) -> int:
    """How many backends wait for a lock on `table` (seen from this connection)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE c.relname = %s AND NOT l.granted",
            [table],
        )
        return int(cursor.fetchone()[0])


def _until(predicate, seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# --- 1. A job renamed while its run on an old day is recorded by another connection ---------------


@pytest.mark.postgres_only(reason="a rename and an insert on two connections at once")
def test_a_job_renamed_while_its_late_run_is_recorded_makes_the_day_stale(fleet_committed):
    """A shard's late heartbeat records the job's run on an old day (its own change, committed) while an
    operator's rename of the job is still open. The rename's statement could not see the run, but it
    notes the days its HQEs started on (locked, so a start written meanwhile is waited for): the build
    waits for the rename, then reads the new name."""
    first = add_run("a1", t(3, 1), t(3, 2), name="before", status="Completed")
    Interval.objects.filter(id=first.id).delete()  # the run is reported below, late
    renamed, commit = threading.Event(), threading.Event()

    def rename() -> None:
        with transaction.atomic():
            Job.objects.filter(id=first.job_id).update(name="after")
            renamed.set()
            assert commit.wait(30)

    writer, errors = in_thread(rename)
    assert renamed.wait(30)
    try:
        Interval.objects.create(  # the late heartbeat's record_runs, committed
            kind="run",
            host_id=first.host_id,
            shard_id=first.shard_id,
            job_id=first.job_id,
            hqe_id=first.hqe_id,
            start=first.start,
            end=first.end,
        )
        builder, build_errors = in_thread(days.build, day(3), timezone.now())
        builder.join(2)
        built_meanwhile = not builder.is_alive()
    finally:
        commit.set()
        writer.join(30)
        builder.join(30)
    assert not errors and not build_errors
    assert not built_meanwhile, "the build waits for the rename"
    exported = "".join(trace_chunks(scope(timezone.now())))
    assert '"after"' in exported, "the renamed job's name"
    assert_same(scope(timezone.now()))


# --- 2. A builder waiting for one long writer queues every other writer behind its lock -----------


@pytest.mark.postgres_only(reason="a writer, a builder and another writer on three connections")
def test_a_builder_waiting_for_a_slow_writer_does_not_hold_up_the_other_writers(fleet_committed):
    """One heartbeat (or a purge batch, or a shell left in a transaction) notes a change to yesterday
    and stays open. The builder's SHARE lock on the changes waits for it, and PostgreSQL queues every
    later ROW EXCLUSIVE request behind that waiting request: each try gives up after 50 ms, so
    another shard's heartbeat finishing a run started yesterday waits that long at most, not for the
    first heartbeat."""
    add_run("a3", t(2, 1), t(2, 2), name="to build")
    mine = add_run("a1", t(1, 22), None, name="mine")
    theirs = add_run("b1", t(1, 23), None, name="theirs")
    holding, release = threading.Event(), threading.Event()

    def slow_heartbeat() -> None:
        with transaction.atomic():
            HostQueueEntry.objects.filter(id=mine.hqe_id).update(status="Completed")
            holding.set()
            assert release.wait(60)

    first, errors = in_thread(slow_heartbeat)
    assert holding.wait(30)
    second = builder = None
    try:
        builder, build_errors = in_thread(days.build, day(2), timezone.now())
        assert _until(lambda: _waiting_for_a_lock("master_tracechange") >= 1), "the builder tries the lock"
        hqes = HostQueueEntry.objects.filter(id=theirs.hqe_id)
        second, second_errors = in_thread(lambda: hqes.update(status="Completed"))
        second.join(3)
        queued = second.is_alive()
        assert not queued, "another shard's heartbeat waited behind the builder's SHARE lock request"
        assert builder.is_alive(), "the builder still waits for the first heartbeat"
    finally:
        release.set()
        first.join(60)
        if builder is not None:
            builder.join(60)
        if second is not None:
            second.join(60)
    assert not errors and not build_errors and not second_errors
    assert day(2) not in days.due(timezone.now())


# --- 3. The build trusts the application's clock, the triggers the database's -----------------------


def test_an_app_clock_ahead_of_the_databases_builds_no_day_the_database_calls_today(fleet):
    """The triggers decide what is "before today" by the database's clock (clock_timestamp(), 'now'):
    a build by an app server's clock an hour and more ahead (another host, no NTP) would build a day
    whose later changes note nothing. Days are told by the earlier of the two clocks."""
    from tests.master.timeline.factories import T0

    today = days.day_of(timezone.now())
    start = days.start_of(today) + timedelta(seconds=1)
    run = add_run("a1", (start - T0).total_seconds(), (start + timedelta(seconds=1) - T0).total_seconds(), name="x")
    ahead = days.start_of(today + 1) + days.COOL + timedelta(minutes=1)  # the app's clock
    with pytest.raises(ValueError, match="by the database's clock"):
        days.build(today, ahead)
    assert today not in days.due(days.database_now())
    days.build_due(ahead)
    HostQueueEntry.objects.filter(id=run.hqe_id).update(status="Aborted")
    assert today not in [d.day for d in days.covering(scope(ahead))]
    assert_same(scope(ahead))


# --- 4. build_trace_days --once while days keep failing ---------------------------------------------


def test_build_trace_days_once_ends_when_days_fail_to_build(fleet, monkeypatch):
    """`--once` loops `while left`, and build_due's `left` counts the days due past its limit, built or
    failed: with more than DAYS_A_PASS days failing (the pieces' table gone, the 30 s lock timeout
    behind a writer left open, a disk full) a cron's `--once` never ends and builds nothing."""
    from django.core.management import call_command

    from master.management.commands import build_trace_days

    for d in range(1, days.DAYS_A_PASS + 3):
        add_run("a1", t(d, 1), t(d, 2))

    def failing(day_: int, settled: int, now):
        raise RuntimeError("a day that cannot be built")

    monkeypatch.setattr(days, "_build", failing)
    passes = 0
    build_due = build_trace_days.build_due

    def counted(*args, **kwargs):
        nonlocal passes
        passes += 1
        if passes > 50:
            raise RuntimeError(f"--once still going after {passes - 1} passes")
        return build_due(*args, **kwargs)

    monkeypatch.setattr(build_trace_days, "build_due", counted)
    call_command("build_trace_days", "--once")
    assert passes <= 2


# --- 5. An HQE whose started_on no longer says its run's day ----------------------------------------


def test_an_hqe_changed_after_its_start_moved_marks_its_runs_day(fleet):
    """The HQE triggers note the day of the HQE's own started_on, assuming "a run's interval starts when
    its HQE did". Only record_runs keeps the two together: started_on set by anything else (a shell, a
    restore, an update the heartbeat applies while the HQE names no host, which record_runs skips)
    moves the HQE's changes to another day than the slice that shows them."""
    from tests.master.timeline.factories import at

    run = add_run("a1", t(3, 1), t(3, 2), name="x")
    HostQueueEntry.objects.filter(id=run.hqe_id).update(started_on=at(t(2, 23)))  # noted: days 3 and 2
    days.build_due(timezone.now())
    HostQueueEntry.objects.filter(id=run.hqe_id).update(status="Aborted")  # noted on day 2 only
    assert_same(scope(timezone.now()))
