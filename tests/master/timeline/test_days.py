"""Built days (master/timeline/days.py): an export that splices them in says exactly what one that reads
every interval says, and whatever changes what a built day shows marks it unbuilt (the triggers)."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from common.models import Host, HostQueueEntry, Job, Shard
from master.timeline import days, slices
from master.timeline.export import trace_chunks
from master.timeline.models import Interval, TraceChange, TraceDay, TracePiece
from master.timeline.query import scope
from tests.master.timeline.days_support import (
    builder_an_hour_ahead,
    events_of,
    events_read_whole,
    exported_gzipped,
    exported_json,
    in_thread,
)
from tests.master.timeline.factories import T0, add_run, add_state
from tests.master.timeline.validate import validate

NOW = timezone.now()
TODAY = days.day_of(NOW)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today as each test starts (a suite may run across midnight); the builder's now an hour on
    (days_support.builder_an_hour_ahead), so that yesterday is due in a day's first hour too."""
    global NOW, TODAY
    real = timezone.now()
    NOW, TODAY = real + days.COOL, days.day_of(real)
    builder_an_hour_ahead(monkeypatch)


def t(days_ago: int, hour: float) -> float:
    """Seconds after the factories' T0 of `hour` o'clock (UTC), `days_ago` days before today."""
    return (days.start_of(TODAY - days_ago) + timedelta(hours=hour) - T0).total_seconds()


def day(days_ago: int) -> int:
    return TODAY - days_ago


@pytest.fixture
def week(fleet):
    """Runs and host states over the last four days and today: open ones, one across midnight, one
    job named in quotes and accents, a failed run."""
    add_run("a1", t(4, 1), t(4, 2), name='bench "quoted" \u00e9\u00e8 \u4e2d')
    add_state("a1", "Cleaning", t(4, 2), t(4, 2.1))
    add_run("a2", t(3, 5), t(3, 6), name="bad", status="Failed", exit_code=3)
    add_state("a2", "Repairing", t(3, 6), None)  # open since three days: not built
    add_run("b1", t(2, 23.5), t(1, 0.5), name="across midnight")
    add_run("a1", t(1, 10), t(1, 11), name="yesterday")
    add_run("a3", t(0, 0.01), None, name="today, running")
    return fleet


def test_a_built_export_says_what_a_whole_read_says(week):
    assert days.due(NOW) == list(range(day(4), day(1) + 1))  # from the first interval's day to yesterday
    assert days.build_due(NOW) == (4, 0)
    s = scope(NOW)
    covered = [d.day for d in days.covering(s)]
    assert day(4) in covered and day(1) in covered and TODAY not in covered
    assert TracePiece.objects.filter(day__in=covered).exists()
    whole = events_read_whole(s)
    assert events_of(exported_gzipped(s)) == whole
    assert events_of(exported_json(s)) == whole
    validate(exported_gzipped(s))
    assert days.build_due(NOW) == (0, 0)  # built once


def test_a_day_is_built_an_hour_after_it_ends_and_not_before(fleet):
    add_run("a1", t(1, 1), t(1, 2))
    just_after_midnight = days.start_of(TODAY) + timedelta(minutes=30)
    assert days.due(just_after_midnight) == []
    with pytest.raises(ValueError, match="has not ended"):
        days.build(day(1), just_after_midnight)
    assert days.due(days.start_of(TODAY) + timedelta(minutes=61)) == [day(1)]


@pytest.mark.parametrize(
    "window",
    [
        {"since_h": (3, 5.5)},  # since mid-day: that day is read, the later ones spliced
        {"until_h": (2, 12)},  # until before the days' end: the days after are read (clipped)
        {"since_h": (3, 0), "until_h": (1, 10.5)},  # since exactly at a day's start: that day read too
    ],
)
def test_a_window_splices_only_the_days_it_holds_whole(week, window):
    days.build_due(NOW)
    since = until = None
    if "since_h" in window:
        since = T0 + timedelta(seconds=t(*window["since_h"]))
    if "until_h" in window:
        until = T0 + timedelta(seconds=t(*window["until_h"]))
    s = scope(NOW, since=since, until=until)
    for covered in days.covering(s):
        assert since is None or days.start_of(covered.day) > since
        assert covered.max_end is None or covered.max_end < s.end
    assert events_of(exported_gzipped(s)) == events_read_whole(s)


def test_a_narrowed_export_reads_every_interval(week):
    days.build_due(NOW)
    for s in (scope(NOW, shards=["lab1"]), scope(NOW, label="wifi"), scope(NOW, jobs=[Job.objects.first().id])):
        assert days.covering(s) == []
        assert events_of(exported_gzipped(s)) == events_read_whole(s)


def test_a_day_of_many_slices_is_built_in_pieces(fleet, monkeypatch):
    monkeypatch.setattr(days, "PIECE_CHARS", 2000)
    monkeypatch.setattr(slices, "CHUNK_ROWS", 5)
    for i in range(60):
        add_run("a1", t(2, i / 10), t(2, i / 10 + 0.05), name=f"run {i} \u00e9")
    days.build(day(2), NOW)
    assert TracePiece.objects.filter(day=day(2)).count() >= 4
    assert TraceDay.objects.get(day=day(2)).intervals == 60
    assert events_of(exported_gzipped(scope(NOW))) == events_read_whole(scope(NOW))
    assert events_of(exported_json(scope(NOW))) == events_read_whole(scope(NOW))


def test_an_export_of_built_days_costs_one_query_more(week, django_assert_num_queries):
    """The days it covers, then their pieces: two queries, however many days and pieces."""
    days.build_due(NOW)
    s = scope(NOW)
    whole = 13 if connection.vendor == "postgresql" else 12
    with django_assert_num_queries(whole + 1):
        exported_json(s)


def test_a_day_built_in_an_older_format_is_built_again(week, monkeypatch):
    days.build_due(NOW)
    monkeypatch.setattr(days, "FORMAT", days.FORMAT + 1)
    assert days.covering(scope(NOW)) == []
    assert days.due(NOW) == list(range(day(4), day(1) + 1))
    assert days.build_due(NOW) == (4, 0)


# Each change that alters what a built day's slices show, and the day it must mark unbuilt.
def _insert_a_run(ids):
    add_run("c1", t(3, 12), t(3, 13), name="reported late")


def _close_the_open_state(ids):
    Interval.objects.filter(id=ids["open"]).update(end=T0 + timedelta(seconds=t(3, 8)))


def _move_a_run(ids):
    Interval.objects.filter(id=ids["run"]).update(start=T0 + timedelta(seconds=t(4, 0.5)))


def _delete_a_run(ids):
    Interval.objects.filter(id=ids["run"]).delete()


def _change_an_hqes_status(ids):
    HostQueueEntry.objects.filter(id=ids["hqe"]).update(status="Aborted")


def _change_an_hqes_exit_code(ids):
    hqe = HostQueueEntry.objects.get(id=ids["hqe"])
    hqe.exit_code = 9
    hqe.save()


def _delete_an_hqe(ids):
    HostQueueEntry.objects.filter(id=ids["hqe"]).delete()


def _rename_a_job(ids):
    Job.objects.filter(id=ids["job"]).update(name="renamed")


def _delete_a_job(ids):
    Job.objects.filter(id=ids["job"]).delete()


def _delete_a_shard(ids):
    Shard.objects.filter(hostname="lab1").delete()  # its intervals keep their hosts, lose their shard


CHANGES = {
    _insert_a_run: 3,
    _close_the_open_state: 3,
    _move_a_run: 4,  # from day 3 to day 4: both
    _delete_a_run: 3,
    _change_an_hqes_status: 3,
    _change_an_hqes_exit_code: 3,
    _delete_an_hqe: 3,
    _rename_a_job: 3,
    _delete_a_job: 3,
    _delete_a_shard: 3,
}


@pytest.mark.parametrize("change", list(CHANGES), ids=lambda c: c.__name__.strip("_"))
def test_a_change_to_a_built_day_makes_it_stale_and_the_export_follows(week, change):
    run = Interval.objects.get(job__name="bad")
    ids = {
        "run": run.id,
        "hqe": run.hqe_id,
        "job": run.job_id,
        "open": Interval.objects.get(end__isnull=True, kind="Repairing").id,
    }
    days.build_due(NOW)
    Host.objects.filter(hostname="c1").update(shard=Shard.objects.get(hostname="lab1"))
    change(ids)
    stale = {day(CHANGES[change])} | ({day(3)} if change is _move_a_run else set())
    assert stale <= set(days.due(NOW))
    assert not stale & {d.day for d in days.covering(scope(NOW))}
    s = scope(NOW)
    assert events_of(exported_gzipped(s)) == events_read_whole(s)
    days.build_due(NOW)
    assert not stale & set(days.due(NOW))
    assert events_of(exported_gzipped(s)) == events_read_whole(s)


def test_todays_intervals_and_their_hqes_note_no_change(fleet):
    """Every heartbeat writes today's intervals and HQEs: the triggers only look at their start."""
    run = add_run("a1", t(0, 0.001), None)
    run.end = timezone.now()
    run.save()
    HostQueueEntry.objects.filter(id=run.hqe_id).update(status="Completed")
    Job.objects.filter(id=run.job_id).update(name="renamed")
    assert not TraceChange.objects.exists()


def test_a_transaction_notes_a_day_once_however_many_rows_it_changes(fleet):
    from django.db import transaction

    with transaction.atomic():
        for i in range(50):
            add_run("a1", t(2, i / 100), t(2, i / 100 + 0.005))
    assert TraceChange.objects.filter(day=day(2)).count() == 1


def test_an_unchanged_hqe_or_job_update_leaves_the_day_current(week):
    days.build_due(NOW)
    run = Interval.objects.get(job__name="bad")
    HostQueueEntry.objects.filter(id=run.hqe_id).update(log_tail="more output")
    Job.objects.filter(id=run.job_id).update(priority=10)
    assert day(3) not in days.due(NOW)


@pytest.mark.postgres_only(reason="needs a build and a change on two connections at once")
def test_a_change_during_a_build_does_not_wait_for_it_and_makes_the_day_stale(fleet_committed, monkeypatch):
    """The build holds what changed before it began; a change while it reads is noted after, so the
    day it commits is stale at once."""
    run = add_run("a1", t(2, 1), t(2, 2), name="before")
    reading, go = threading.Event(), threading.Event()
    texts = days.slice_texts

    def slow_texts(*args, **kwargs):
        reading.set()
        assert go.wait(30)
        yield from texts(*args, **kwargs)

    monkeypatch.setattr(days, "slice_texts", slow_texts)
    builder, build_errors = in_thread(days.build, day(2), NOW)
    assert reading.wait(30)
    writer, write_errors = in_thread(lambda: Job.objects.filter(id=run.job_id).update(name="after"))
    writer.join(10)
    assert not writer.is_alive(), "a change does not wait for a build"
    go.set()
    builder.join(30)
    assert not build_errors and not write_errors
    assert day(2) in days.due(NOW)
    assert '"after"' in "".join(trace_chunks(scope(NOW)))
    assert days.build_due(NOW)[0] >= 1
    assert days.covering(scope(NOW)) and '"after"' in "".join(trace_chunks(scope(NOW)))


@pytest.mark.postgres_only(reason="needs a build and a change on two connections at once")
def test_a_build_waits_for_a_change_in_flight_and_reads_it(fleet_committed):
    run = add_run("a1", t(2, 1), t(2, 2), name="before")
    changed, commit = threading.Event(), threading.Event()

    def change() -> None:
        from django.db import transaction

        with transaction.atomic():
            Job.objects.filter(id=run.job_id).update(name="after")
            changed.set()
            assert commit.wait(30)

    writer, write_errors = in_thread(change)
    assert changed.wait(30)
    builder, build_errors = in_thread(days.build, day(2), NOW)
    time.sleep(0.5)
    assert builder.is_alive(), "the build waits for the change's lock"
    commit.set()
    writer.join(30)
    builder.join(30)
    assert not build_errors and not write_errors
    assert day(2) not in days.due(NOW)
    s = scope(NOW)
    assert days.covering(s) and '"after"' in "".join(trace_chunks(s))
    assert events_of(exported_json(s)) == events_read_whole(s)


def test_the_builder_thread_builds_due_days_and_stops(fleet_committed):
    add_run("a1", t(2, 1), t(2, 2))
    thread, stop = days.start_builder_thread(interval_s=0.1)
    try:
        deadline = time.monotonic() + 30
        while not TraceDay.objects.filter(day=day(2), built=True).exists():
            assert time.monotonic() < deadline, "the builder thread built nothing"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_a_day_with_a_slice_ending_after_now_is_read_whole(fleet):
    """A slice reported as ending after the export's now (a shard's clock ahead) is clipped to it:
    its day is read, not spliced."""
    add_run("a1", t(2, 1), t(2, 2))
    ahead = add_run("a2", t(2, 3), t(2, 4))
    Interval.objects.filter(id=ahead.id).update(end=NOW + timedelta(days=3))
    add_run("a1", t(3, 1), t(3, 2))
    days.build_due(NOW)
    s = scope(timezone.now())
    covered = [d.day for d in days.covering(s)]
    assert day(3) in covered and day(2) not in covered
    assert events_of(exported_gzipped(s)) == events_read_whole(s)


def test_build_trace_days_once_builds_every_due_day(week, capsys):
    from django.core.management import call_command

    call_command("build_trace_days", "--once")
    assert capsys.readouterr().out.strip() == "4 days built"
    assert days.due(timezone.now()) == []
    call_command("build_trace_days", "--once")
    assert capsys.readouterr().out.strip() == "0 days built"


def test_build_trace_days_refuses_a_bad_interval(db):
    from django.core.management import call_command

    with pytest.raises(Exception, match="--interval must be positive, got -1.0"):
        call_command("build_trace_days", "--interval", "-1")
