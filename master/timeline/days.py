"""Closed days of the timeline, built once (docs/design.md, "Timelines", built days).

An export formatted every slice (in the database) and compressed it (here) again at each export: a
million intervals took seconds of both. A day whose intervals have ended changes rarely, so its
slices' text is built once, as raw deflate pieces (master.timeline.deflate) that a gzipped export
splices in unchanged and a JSON one inflates.

- A day is a UTC day of intervals' starts; it is built an hour after it ends (COOL), by a thread of
  each `serve` worker (FLEETSHARD_SERVE_BACKGROUND) or by `manage.py build_trace_days` (with
  FLEETSHARD_TRACE_DAYS_IN_SERVE=0). Open intervals are not in it.
- Whatever changes what a day before today shows appends a TraceChange in the changing transaction
  (database triggers, migration 0014); a built day whose `as_of` is older than its newest change is
  stale, read as if not built until built again. Today's intervals, which every heartbeat writes,
  append nothing.
- A build first takes the newest change whose writer, and every older one's, has committed
  (PostgreSQL: a SHARE lock on the changes, tried for 50 ms at a time, waits for writers in flight),
  then reads: it holds every change up to that number, and one made later has a higher number and
  makes the day stale. Builders of one day take turns on its row; a writer waits for a builder 50 ms
  at most, never for a build. Days are told by the database's clock, as the triggers tell them.
- An export splices in the built, current days its window holds whole, whose slices all end before it
  does, and reads everything else as before (today, open intervals, days stale or not built yet). An
  export narrowed to shards, a label or jobs reads everything as before.
"""

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import cast

from django.db import OperationalError, close_old_connections, connection, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q
from django.utils import timezone

from common.loop import Backoff, run_until_stopped
from master.timeline import deflate
from master.timeline.deflate import Packed
from master.timeline.models import Interval, TraceChange, TraceDay, TracePiece
from master.timeline.query import Scope, selected
from master.timeline.slices import slice_texts

log = logging.getLogger(__name__)

FORMAT = 1  # the slices' format (master.timeline.slices): days built in another are built again
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
COOL = timedelta(hours=1)  # a day is built this long after it ends: its last runs are reported by then
PIECE_CHARS = 1 << 20  # a piece's text, about: read whole, and it leaves an export as one chunk
PIECE_LEVEL = 9  # built once: the smallest
DAYS_A_PASS = 30
INTERVAL_S = 60.0
_UNCLIPPED = datetime(9999, 1, 1, tzinfo=UTC)  # a scope's `now` that clips no closed interval


def day_of(when: datetime) -> int:
    return (when - EPOCH) // DAY


def start_of(day: int) -> datetime:
    return EPOCH + day * DAY


def _current() -> Q:
    """Built in this format, and nothing changed since."""
    newer = TraceChange.objects.filter(day=OuterRef("day"), id__gt=OuterRef("as_of"))
    return Q(built=True, format=FORMAT) & ~Q(Exists(newer))


def due(now: datetime) -> list[int]:
    """The days from the first interval's to the last that ended COOL ago which are not built and
    current."""
    first = Interval.objects.aggregate(t=Min("start"))["t"]
    if first is None:
        return []
    lo, hi = day_of(first), day_of(now - COOL) - 1
    current = set(TraceDay.objects.filter(_current(), day__gte=lo, day__lte=hi).values_list("day", flat=True))
    return [d for d in range(lo, hi + 1) if d not in current]


def build(day: int, now: datetime | None = None, settled: int | None = None) -> bool:
    """Builds `day` unless it is built and current; returns whether it built it. `settled`: a number
    `_settled_change` returned before (a pass takes one for all its days)."""
    now = now or timezone.now()
    if day > day_of(min(now, database_now()) - COOL) - 1:
        raise ValueError(f"day {day} ({start_of(day):%Y-%m-%d}) has not ended {COOL} ago, by the database's clock")
    return _build(day, _settled_change() if settled is None else settled, now)


SETTLE_LOCK = "50ms"  # how long a builder's lock may hold writers up, a try
SETTLE_TRIES = 40
SETTLE_PAUSE_S = 0.5


def _settled_change() -> int:
    """The newest change whose writer, and the writer of every older one, has committed. On
    PostgreSQL a change's number is drawn before its transaction commits, so one in flight could
    commit later with a lower number: a SHARE lock on the changes waits for those writers. A writer
    asking meanwhile queues behind it, so each try gives up after SETTLE_LOCK and pauses: a writer
    waits that long at most, and a builder facing a writer left open builds nothing this pass."""
    for _ in range(SETTLE_TRIES):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute(f"SET LOCAL lock_timeout = '{SETTLE_LOCK}'")
                    cursor.execute("LOCK TABLE master_tracechange IN SHARE MODE")
                cursor.execute("SELECT COALESCE(MAX(id), 0) FROM master_tracechange")
                return int(cursor.fetchone()[0])
        except OperationalError as exc:
            if getattr(exc.__cause__, "pgcode", None) != "55P03":  # lock_not_available
                raise
        time.sleep(SETTLE_PAUSE_S)
    raise TimeoutError(f"a writer held the trace changes through {SETTLE_TRIES} tries: no day built this pass")


def database_now() -> datetime:
    """The database's clock, which the triggers go by (the app's may be ahead of it)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")
            return cast(datetime, cursor.fetchone()[0])
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


@transaction.atomic
def _build(day: int, settled: int, now: datetime) -> bool:
    with connection.cursor() as cursor:
        # The day's row, locked to the commit: builders of one day take turns (writers never take it).
        cursor.execute(
            "INSERT INTO master_traceday (day, built, format, as_of, intervals) VALUES (%s, FALSE, 0, 0, 0)"
            " ON CONFLICT (day) DO UPDATE SET built = master_traceday.built",
            [day],
        )
    if TraceDay.objects.filter(_current(), day=day).exists():
        return False
    row = TraceDay.objects.get(day=day)
    TracePiece.objects.filter(day=row).delete()
    on_day = Q(start__gte=start_of(day), start__lt=start_of(day + 1))
    closed = selected(Scope(_UNCLIPPED)).filter(on_day, end__isnull=False)
    seq, texts, chars = 0, [""], 0
    for text in slice_texts(closed, batched=True):
        texts.append(text)
        chars += len(text) + 1
        if chars >= PIECE_CHARS:
            _write_piece(row, seq, texts)
            seq, texts, chars = seq + 1, [""], 0
    if chars:
        _write_piece(row, seq, texts)
    counted = closed.aggregate(n=Count("id"), end=Max("end"))
    row.built, row.format, row.as_of, row.built_on = True, FORMAT, settled, now
    row.intervals, row.max_end = counted["n"], counted["end"]
    row.save()
    TraceChange.objects.filter(day=day, id__lte=settled).delete()  # held by the build now
    return True


def _write_piece(day: TraceDay, seq: int, texts: list[str]) -> None:
    """`texts` starts with "": each slice follows a comma, so a piece may follow any event."""
    piece = deflate.pack(",".join(texts), PIECE_LEVEL)
    TracePiece.objects.create(day=day, seq=seq, body=piece.body, crc=piece.crc, size=piece.size)


def build_due(now: datetime | None = None, limit: int = DAYS_A_PASS) -> tuple[int, int]:
    """Builds up to `limit` due days; returns how many it built and how many are still due. A day
    that fails to build is logged and left for the next pass, not in the way of the days after it."""
    now = min(now or timezone.now(), database_now())
    days = due(now)
    if not days:
        return 0, 0
    settled, built = _settled_change(), 0
    for day in days[:limit]:
        try:
            built += build(day, now, settled)
        except Exception:
            log.exception("trace day %d (%s) failed to build; tried again on the next pass", day, start_of(day).date())
    return built, max(0, len(days) - limit)


def covering(s: Scope) -> list[TraceDay]:
    """The built days an export of `s` splices in: inside its window whole, every slice ended before
    the window does (a slice is clipped to it otherwise); none for a narrowed export."""
    if s.shards or s.label is not None or s.jobs:
        return []
    days = TraceDay.objects.filter(_current(), day__lte=day_of(s.end)).order_by("day")
    if s.since is not None:
        days = days.filter(day__gt=day_of(s.since))  # the day's start after `since`
    return [d for d in days if start_of(d.day) < s.end and (d.max_end is None or d.max_end < s.end)]


def spliced(days: list[TraceDay]) -> Q:
    """The intervals the pieces of `days` hold, so the export reads them no more: closed, starting on one."""
    spans: list[list[int]] = []
    for d in sorted(day.day for day in days):
        if spans and spans[-1][1] == d:
            spans[-1][1] = d + 1
        else:
            spans.append([d, d + 1])
    on_them = Q()
    for lo, hi in spans:
        on_them |= Q(start__gte=start_of(lo), start__lt=start_of(hi))
    return Q(end__isnull=False) & on_them


def pieces(days: list[TraceDay]) -> Iterator[Packed]:
    if not days:
        return
    rows = TracePiece.objects.filter(day__in=[d.day for d in days]).order_by("day", "seq")
    for body, crc, size in rows.values_list("body", "crc", "size").iterator(chunk_size=2):
        yield Packed(bytes(body), crc, size)


def run_builder(stop: threading.Event, interval_s: float = INTERVAL_S) -> None:
    """Builds due days until `stop` is set, a pass each `interval_s` (at once while more are due)."""

    def step() -> float:
        close_old_connections()
        _, left = build_due()
        return 0.0 if left else interval_s

    run_until_stopped(
        step,
        stop,
        what="trace day builder",
        log=log,
        backoff=Backoff(base_s=interval_s, cap_s=10 * interval_s),
        on_error=lambda exc: connection.close(),
    )
    connection.close()


def start_builder_thread(interval_s: float = INTERVAL_S) -> tuple[threading.Thread, threading.Event]:
    """Starts `run_builder` in a daemon thread (the master's `serve` does, in each worker)."""
    stop = threading.Event()
    thread = threading.Thread(target=run_builder, args=(stop, interval_s), name="trace-day-builder", daemon=True)
    thread.start()
    return thread, stop
