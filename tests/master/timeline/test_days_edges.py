"""Built days at their edges (master/timeline/days.py), from a hostile review: times at day boundaries,
restored rows, writers and builders on several connections, a day that fails to build. Each export
must say what a read of every interval says; writers must never wait for each other or a builder."""

import gzip
import json
import random
import subprocess
import threading
import time
import zlib
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from common.models import HostQueueEntry, Job
from master.timeline import days, deflate, slices
from master.timeline.export import gzipped, trace_chunks, trace_pieces
from master.timeline.limits import Deadline
from master.timeline.models import Interval, TraceDay, TracePiece
from master.timeline.query import scope
from tests.master.timeline.days_support import (
    assert_same,
    builder_an_hour_ahead,
    events_of,
    events_read_whole,
    exported_gzipped,
    in_thread,
)
from tests.master.timeline.factories import T0, add_run, add_state

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
    return (days.start_of(TODAY - days_ago) + timedelta(hours=hour) - T0).total_seconds()


def at_day(days_ago: int, **delta: float):
    return days.start_of(TODAY - days_ago) + timedelta(**delta)


def secs(when) -> float:
    return (when - T0).total_seconds()


def day(days_ago: int) -> int:
    return TODAY - days_ago


# --- 1. SQLite: the trigger's day of a start in a day's last half millisecond -----------------------


def test_a_run_starting_in_the_last_half_millisecond_of_a_day_marks_its_own_day(fleet):
    """SQLite's strftime('%s', ...) reads a time to the millisecond, rounded: 23:59:59.9996 would be the
    next day's 00:00:00, where the build puts the run in its own day (the ORM compares the text)."""
    late = add_run("a1", secs(at_day(3, hours=23, minutes=59, seconds=59, microseconds=999600)), t(2, 1), name="late")
    add_run("a2", t(3, 5), t(3, 6))
    days.build_due(NOW)
    assert day(3) not in days.due(NOW)
    Job.objects.filter(id=late.job_id).update(name="renamed")
    assert_same(scope(NOW))
    assert day(3) in days.due(NOW), "renaming the run's job makes its day stale"


# --- 2. A job or HQE (re)inserted with the id a built day's slice names ------------------------------


@pytest.mark.parametrize("what", ["job", "hqe"])
def test_a_deleted_job_or_hqe_restored_with_its_id_makes_the_day_stale(fleet, what):
    """Deleting a job makes its day stale; the rebuilt day says "job N" (no name). Restoring the row
    with its old id (loaddata of a backup, an operator's INSERT) changes what the slice shows again."""
    run = add_run("a1", t(3, 1), t(3, 2), name="precious", status="Failed", exit_code=4)
    job = Job.objects.get(id=run.job_id)
    hqe = HostQueueEntry.objects.get(id=run.hqe_id)
    days.build_due(NOW)
    if what == "job":
        Job.objects.filter(id=job.id).delete()  # its HQE goes too (cascade)
    else:
        HostQueueEntry.objects.filter(id=hqe.id).delete()
    days.build_due(NOW)
    assert day(3) not in days.due(NOW)
    if what == "job":
        job.save(force_insert=True)  # same id
    hqe.save(force_insert=True)
    assert_same(scope(NOW))
    assert day(3) in days.due(NOW), f"restoring the {what} makes the day stale"


# --- 3. Windows around day boundaries, intervals at the edges ------------------------------------


def test_windows_around_day_boundaries_say_what_a_whole_read_says(fleet):
    mid = days.start_of(day(3))
    add_run("a1", secs(mid - timedelta(microseconds=1)), secs(mid), name="ends at midnight")
    add_run("a2", secs(mid), secs(mid), name="zero length at midnight")
    add_state("a3", "Cleaning", secs(mid + timedelta(microseconds=1)), secs(mid + timedelta(seconds=1)))
    add_run(
        "b1",
        secs(mid + timedelta(hours=23, minutes=59, seconds=59, microseconds=999999)),
        secs(days.start_of(day(2))),
        name="last microsecond",
    )
    add_run("a1", t(2, 3), t(2, 4), name='plain \\ " \n \t \u2028 \U0001f600')
    add_state("a2", "Repairing", t(4, 1), None)  # open on an old day
    add_run("a3", t(1, 22), secs(NOW + timedelta(hours=5)), name="ends in the future")
    add_run("c1", t(0, 0.001), t(0, 0.002), name="today")
    days.build_due(NOW)
    assert len(days.covering(scope(NOW))) >= 3
    edges = [days.start_of(day(d)) + timedelta(microseconds=us) for d in range(1, 6) for us in (-1, 0, 1)]
    edges += [None]
    for since in edges:
        for until in edges:
            if since is not None and until is not None and until <= since:
                continue
            for now in (NOW, days.start_of(day(1)) + timedelta(hours=2)):
                if since is not None and since > now:
                    continue
                s = scope(now, since=since, until=until)
                whole = events_read_whole(s)
                assert events_of(exported_gzipped(s)) == whole, (since, until, now)


# --- 4. Deadline while splicing pieces; a reader gone ----------------------------------------------


def test_an_export_cut_short_among_pieces_is_valid(fleet, monkeypatch):
    monkeypatch.setattr(days, "PIECE_CHARS", 500)
    monkeypatch.setattr(slices, "CHUNK_ROWS", 3)
    for i in range(40):
        add_run("a1", t(2, i / 20), t(2, i / 20 + 0.01), name=f"run {i}")
    days.build_due(NOW)
    assert TracePiece.objects.filter(day=day(2)).count() > 3
    past = Deadline(1.0, time.monotonic() - 1, enforce_idle=False)
    data = b"".join(gzipped(trace_pieces(scope(NOW), past)))
    assert subprocess.run(["gzip", "-t"], input=data).returncode == 0
    trace = json.loads(gzip.decompress(data))
    assert "cut_short" in trace["otherData"]
    trace = json.loads("".join(trace_chunks(scope(NOW), Deadline(1.0, time.monotonic() - 1, enforce_idle=False))))
    assert "cut_short" in trace["otherData"]


def test_a_reader_that_stops_among_pieces_leaves_the_connection_usable(fleet, monkeypatch):
    monkeypatch.setattr(days, "PIECE_CHARS", 500)
    for i in range(40):
        add_run("a1", t(2, i / 20), t(2, i / 20 + 0.01), name=f"run {i}")
    days.build_due(NOW)
    out = gzipped(trace_pieces(scope(NOW)))
    next(out)
    next(out)
    out.close()
    assert Interval.objects.count() == 40
    assert_same(scope(NOW))


# --- 5. The splicing itself ----------------------------------------------------------------------


def test_joined_texts_and_pieces_are_one_valid_gzip_member():
    rng = random.Random(7)
    for _ in range(200):
        joiner, out, want = deflate.Joiner(rng.choice([1, 6, 7, 9])), [], []
        for _ in range(rng.randrange(0, 8)):
            text = "".join(rng.choice('ab"\\\u00e9\u4e2d\n{}, ') for _ in range(rng.choice([0, 1, 5, 70000])))
            if rng.random() < 0.5:
                out.append(joiner.text(text))
            else:
                out.append(joiner.piece(deflate.pack(text, rng.choice([1, 9]))))
            want.append(text)
        out.append(joiner.finish())
        data = b"".join(out)
        assert gzip.decompress(data).decode() == "".join(want)
        reader = zlib.decompressobj(31)
        assert reader.decompress(data).decode() == "".join(want) and reader.eof and not reader.unused_data
    assert subprocess.run(["gzip", "-t"], input=data).returncode == 0


def test_crc32_combine_matches_zlib():
    rng = random.Random(3)
    for _ in range(300):
        a, b = rng.randbytes(rng.randrange(0, 300)), rng.randbytes(rng.choice([0, 1, 7, 1000, 1 << 16]))
        assert deflate.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


# --- 6. Builders and migrations --------------------------------------------------------------------


def test_a_day_with_no_intervals_left_is_built_empty_and_spliced_as_nothing(fleet):
    add_run("a1", t(4, 1), t(4, 2))
    gone = add_run("a1", t(3, 1), t(3, 2))
    add_run("a1", t(2, 1), t(2, 2))
    days.build_due(NOW)
    Interval.objects.filter(id=gone.id).delete()
    days.build_due(NOW)
    assert TraceDay.objects.get(day=day(3)).built and not TracePiece.objects.filter(day=day(3)).exists()
    assert_same(scope(NOW))


# --- 7. PostgreSQL: writers and builders on several connections ----------------------------------


@pytest.mark.postgres_only(reason="needs a change and an insert on two connections at once")
def test_an_hqe_change_in_flight_while_its_run_is_recorded_makes_the_day_stale(fleet_committed):
    """An HQE changed by a transaction still open while its run's interval is recorded by another: the
    HQE's change is noted by its own start (a run's interval starts when its HQE did), not by the
    intervals that transaction could see, and a build waits for it to commit."""
    first = add_run("a1", t(3, 1), t(3, 2), name="late run", status="Completed")
    Interval.objects.filter(id=first.id).delete()  # the run is reported again below
    changed, commit = threading.Event(), threading.Event()

    def abort() -> None:
        with transaction.atomic():
            HostQueueEntry.objects.filter(id=first.hqe_id).update(status="Aborted")
            changed.set()
            assert commit.wait(30)

    writer, errors = in_thread(abort)
    assert changed.wait(30)
    Interval.objects.create(
        kind="run",
        host_id=first.host_id,
        shard_id=first.shard_id,
        job_id=first.job_id,
        hqe_id=first.hqe_id,
        start=first.start,
        end=first.end,
    )
    builder, build_errors = in_thread(days.build, day(3), NOW)
    builder.join(0.5)
    assert builder.is_alive(), "the build waits for the change in flight"
    commit.set()
    writer.join(30)
    builder.join(30)
    assert not errors and not build_errors
    assert day(3) not in days.due(NOW)
    assert '"Aborted"' in "".join(trace_chunks(scope(timezone.now())))
    assert_same(scope(timezone.now()))


def _heartbeat_like(hqe_ids: list[int], between: threading.Barrier) -> None:
    """A heartbeat's transaction: its HQE updates, one at a time in its own order."""
    with transaction.atomic():
        for i, hqe in enumerate(hqe_ids):
            HostQueueEntry.objects.filter(id=hqe).update(status="Completed")
            if i == 0:
                between.wait(30)


@pytest.mark.postgres_only(reason="needs two writers at once")
def test_two_writers_of_distinct_hqes_do_not_deadlock_on_their_runs_days(fleet_committed):
    """Two shards' heartbeats each finish two long runs that started on two old days (distinct HQEs,
    distinct jobs: no row in common), in opposite orders: the changes they note are rows of their own."""
    a1 = add_run("a1", t(2, 1), None, name="a day 2")
    a2 = add_run("a2", t(3, 1), None, name="a day 3")
    b1 = add_run("b1", t(2, 2), None, name="b day 2")
    b2 = add_run("b1", t(3, 2), None, name="b day 3")
    between = threading.Barrier(2)
    one, errors_one = in_thread(_heartbeat_like, [a1.hqe_id, a2.hqe_id], between)
    two, errors_two = in_thread(_heartbeat_like, [b2.hqe_id, b1.hqe_id], between)
    one.join(30)
    two.join(30)
    assert not errors_one and not errors_two, (errors_one, errors_two)


@pytest.mark.postgres_only(reason="needs two writers at once")
def test_writers_of_distinct_hqes_whose_runs_started_yesterday_do_not_wait_for_each_other(fleet_committed):
    """After midnight every heartbeat that finishes a run started yesterday notes a change to yesterday:
    a row of its own each, so the fleet's heartbeats do not queue on one."""
    mine = add_run("a1", t(1, 22), None, name="mine")
    theirs = add_run("b1", t(1, 23), None, name="theirs")
    holding, release = threading.Event(), threading.Event()

    def slow_heartbeat() -> None:
        with transaction.atomic():
            HostQueueEntry.objects.filter(id=mine.hqe_id).update(status="Completed")
            holding.set()
            assert release.wait(30)

    first, errors = in_thread(slow_heartbeat)
    assert holding.wait(30)
    try:
        started = time.monotonic()
        hqes = HostQueueEntry.objects.filter(id=theirs.hqe_id)
        second, _ = in_thread(lambda: hqes.update(status="Completed"))
        second.join(2)
        waited = time.monotonic() - started
        assert not second.is_alive(), f"a heartbeat of another shard waited {waited:.1f} s for one in flight"
    finally:
        release.set()
        first.join(30)
        second.join(30)


@pytest.mark.postgres_only(reason="needs two builders at once")
def test_two_builders_at_once_build_each_day_once(fleet_committed):
    for d in range(1, 6):
        add_run("a1", t(d, 1), t(d, 2), name=f"day {d}")
    results: list[tuple[int, int]] = []
    threads = [in_thread(lambda: results.append(days.build_due(NOW))) for _ in range(3)]
    for thread, errors in threads:
        thread.join(60)
        assert not errors
    assert sum(built for built, _ in results) == 5
    assert TracePiece.objects.count() == 5
    assert_same(scope(timezone.now()))


def test_a_run_without_a_job_is_exported_and_built_like_the_others(fleet):
    """A run interval naming no job (the model allows it) once had no slice text on PostgreSQL
    ('job ' || NULL) and a null name on SQLite."""
    bad = add_run("a1", t(5, 1), t(5, 2))
    Interval.objects.filter(id=bad.id).update(job=None)
    days.build_due(NOW)
    assert day(5) not in days.due(NOW)
    assert_same(scope(NOW))
    assert '"name":"run","cat":"run"' in "".join(trace_chunks(scope(NOW)))


def test_a_day_that_fails_to_build_does_not_keep_the_later_days_from_being_built(fleet, monkeypatch):
    for d in range(1, 6):
        add_run("a2", t(d, 1), t(d, 2))
    build = days._build

    def failing(day_: int, settled: int, now):
        if day_ == day(5):
            raise RuntimeError("a day that cannot be built")
        return build(day_, settled, now)

    monkeypatch.setattr(days, "_build", failing)
    assert days.build_due(NOW) == (4, 0)
    assert days.due(NOW) == [day(5)]


def test_the_migration_reversed_and_reapplied_still_marks_days(fleet_committed):
    from django.core.management import call_command

    run = add_run("a1", t(3, 1), t(3, 2), name="before")
    call_command("migrate", "master", "0013", verbosity=0)
    call_command("migrate", "master", verbosity=0)
    days.build_due(NOW)
    Job.objects.filter(id=run.job_id).update(name="after")
    assert day(3) in days.due(NOW)
    assert_same(scope(timezone.now()))


@pytest.mark.postgres_only(reason="generate_series, session_replication_role, two connections")
def test_a_heartbeat_finishing_a_run_started_yesterday_does_not_wait_for_the_builder(fleet_committed):
    """The builder formats and compresses (level 9) a whole day of 200,000 intervals; the heartbeat
    that ends a run started that day (its HQE's status, its interval's end) does not wait for it."""
    from common.models import Host

    h = Host.objects.get(hostname="a1").id
    running = add_run("a2", t(1, 23.9), None, name="crosses midnight")
    start = days.start_of(day(1))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # the fill without its triggers
        cursor.execute(
            'INSERT INTO master_interval (kind, host_id, start, "end") '
            "SELECT 'Cleaning', %s, %s::timestamptz + make_interval(secs => n * 0.4), "
            "%s::timestamptz + make_interval(secs => n * 0.4 + 0.2) FROM generate_series(1, 200000) AS n",
            [h, start, start],
        )
    building = threading.Event()
    texts = days.slice_texts

    def watched(*args, **kwargs):
        building.set()
        yield from texts(*args, **kwargs)

    days.slice_texts = watched  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        builder, errors = in_thread(days.build, day(1), NOW)
        assert building.wait(30)
        t0 = time.perf_counter()
        HostQueueEntry.objects.filter(id=running.hqe_id).update(status="Completed")
        waited = time.perf_counter() - t0
        builder.join(120)
        took = time.perf_counter() - started
    finally:
        days.slice_texts = texts
    assert not errors
    assert waited < min(1.0, took / 2), f"the HQE update waited {waited:.1f} s of the build's {took:.1f} s"


def test_the_builder_thread_recovers_from_a_database_error(fleet_committed):
    add_run("a1", t(2, 1), t(2, 2))
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE master_tracepiece RENAME TO master_tracepiece_away")
    thread, stop = days.start_builder_thread(interval_s=0.1)
    try:
        time.sleep(1.0)  # its passes fail: no table for the pieces
        assert not TraceDay.objects.filter(built=True).exists()  # every pass failed, none was lost
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE master_tracepiece_away RENAME TO master_tracepiece")
        deadline = time.monotonic() + 30
        while not TraceDay.objects.filter(day=day(2), built=True).exists():
            assert time.monotonic() < deadline, "the builder did not recover"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert_same(scope(timezone.now()))
