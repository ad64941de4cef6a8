"""When regression detection runs: after each upload, but outside it.

An upload marks the series it touched dirty (`mark_dirty`, in the upload's transaction); a detector
(the thread `serve` starts in each master worker, `manage.py detect_regressions`, or `drain` in a
test) claims dirty series, runs master.results.regressions on them, and deletes each row whose
stamp no upload changed meanwhile. So an upload costs one upsert, several uploads to a series cost
one detection, and a series marked but not yet read survives a crash of the master.
"""

import logging
import secrets
import threading
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from common.loop import Backoff, run_until_stopped
from master.results.models import DirtySeries, TestEntry
from master.results.regressions import detect_after_upload

log = logging.getLogger("master.results.detection")

# Series claimed at once; a claim not finished within LEASE (its detector died) is taken over.
BATCH = 500
LEASE = timedelta(minutes=5)
# How often an idle detector looks for dirty series, and how long the served detector lets a series
# settle after it was marked: uploads to it meanwhile share one detection, and a burst of uploads
# leaves the CPU to the requests. Tests and `detect_regressions --once` read at once.
INTERVAL_S = 1.0
SETTLE = timedelta(seconds=5)
# A failing drain (the database is away) is retried within this long.
RETRY_CAP_S = 30.0

Claimed = list[tuple[int, str, str, str, int]]  # (row id, test, entry, label, stamp)


def mark_dirty(run_id: int, now: datetime | None = None) -> None:
    """Marks the series of a stored run's entries dirty, in one statement inside the caller's
    transaction. Rows go in entry order, so two uploads to the same series lock them in one order.

    A series already marked and not claimed is only locked (ON CONFLICT locks every conflicting
    row), not rewritten: no detector can claim it before this upload commits (it skips locked
    rows), so the detection it is waiting for will read this upload too. Rewriting it anyway
    left a dead row per series per upload, which made the upsert several times slower."""
    now = now or timezone.now()
    qn = connection.ops.quote_name
    dirty, entries = qn(DirtySeries._meta.db_table), qn(TestEntry._meta.db_table)
    # "WHERE true": SQLite's parser needs it between INSERT ... SELECT and ON CONFLICT.
    sql = (
        f"INSERT INTO {dirty} (test, entry, label, stamp, marked_on) "
        f"SELECT test, entry, label, %s, %s FROM {entries} WHERE run_id = %s AND true ORDER BY entry "
        "ON CONFLICT (test, entry, label) DO UPDATE "
        "SET stamp = excluded.stamp, marked_on = excluded.marked_on, claimed_until = NULL "
        f"WHERE {dirty}.claimed_until IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [secrets.randbits(62), connection.ops.adapt_datetimefield_value(now), run_id])


def claim(limit: int, now: datetime, settle: timedelta = timedelta(0)) -> Claimed:
    """Up to `limit` dirty series no live detector holds, marked at least `settle` ago, claimed for
    LEASE. Rows an upload is marking right now are skipped (PostgreSQL: SKIP LOCKED), never waited
    for: no deadlock."""
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    with transaction.atomic():
        rows = list(
            DirtySeries.objects.select_for_update(skip_locked=True)
            .filter(free, marked_on__lte=now - settle)
            .order_by("id")
            .values_list("id", "test", "entry", "label", "stamp")[:limit]
        )
        if rows:
            DirtySeries.objects.filter(id__in=[r[0] for r in rows]).update(claimed_until=now + LEASE)
    return rows


def drain_once(limit: int = BATCH, now: datetime | None = None, settle: timedelta = timedelta(0)) -> int:
    """Runs the detector on up to `limit` dirty series; returns how many it claimed."""
    now = now or timezone.now()
    claimed = claim(limit, now, settle)
    detect_claimed(claimed, now)
    return len(claimed)


def detect_claimed(claimed: Claimed, now: datetime) -> None:
    """Runs the detector on claimed series, one query pair per (test, label), then forgets each
    series no upload marked again meanwhile. A series whose detection fails stays claimed (and
    logged) until its lease ends, then is tried again."""
    groups: dict[tuple[str, str], list[tuple[int, str, int]]] = defaultdict(list)
    for row_id, test, entry, label, stamp in claimed:
        groups[(test, label)].append((row_id, entry, stamp))
    done: dict[int, int] = {}
    for (test, label), rows in groups.items():
        try:
            with transaction.atomic():
                detect_after_upload(test, label, sorted(entry for _, entry, _ in rows), now)
        except Exception:
            log.exception("regression detection failed for test %r label %r; retried after %s", test, label, LEASE)
            continue
        done.update((row_id, stamp) for row_id, _, stamp in rows)
    _forget(done)


@transaction.atomic
def _forget(done: dict[int, int]) -> None:
    """Deletes the rows of `done` (id: stamp as claimed) whose stamp is unchanged. A row an upload
    holds is skipped, never waited for (so no deadlock): that upload re-marks it, which frees it
    for the next drain."""
    if not done:
        return
    held = DirtySeries.objects.select_for_update(skip_locked=True).filter(id__in=list(done))
    gone = [row_id for row_id, stamp in held.values_list("id", "stamp") if done[row_id] == stamp]
    DirtySeries.objects.filter(id__in=gone).delete()


def drain(limit: int = BATCH) -> int:
    """Runs the detector until no dirty series is left to claim; returns how many it read."""
    total = 0
    while True:
        done = drain_once(limit)
        total += done
        if done < limit:
            return total


def run_detector(stop: threading.Event, interval_s: float = INTERVAL_S) -> None:
    """The detector's loop, until `stop` is set: drains series settled for SETTLE, then waits
    `interval_s` when none is left. A database error is logged and retried on a fresh connection
    after a jittered back-off (within RETRY_CAP_S)."""

    def step() -> float:
        close_old_connections()
        return 0.0 if drain_once(settle=SETTLE) == BATCH else interval_s

    run_until_stopped(
        step,
        stop,
        what="regression detector",
        log=log,
        backoff=Backoff(base_s=interval_s, cap_s=max(interval_s, RETRY_CAP_S)),
        on_error=lambda exc: connection.close(),
    )
    connection.close()


def start_detector_thread(interval_s: float = INTERVAL_S) -> tuple[threading.Thread, threading.Event]:
    """Starts `run_detector` in a daemon thread (the master's `serve` does, in each worker)."""
    stop = threading.Event()
    thread = threading.Thread(target=run_detector, args=(stop, interval_s), name="regression-detector", daemon=True)
    thread.start()
    return thread, stop
