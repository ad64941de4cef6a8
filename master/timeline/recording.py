"""How intervals are written: runs from the HQE updates the heartbeat applies, host states from the
shard's host events (`record_host_changes`, docs/protocol.md "host_events").

Both are idempotent: an update or report seen twice leaves the intervals as they were.
"""

import bisect
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Greatest

from common.bulk import _json_default, bulk_insert, bulk_set
from common.constants import HostStatus
from common.errors import FleetshardError, NotFound
from common.models import Host, Shard
from master.timeline.models import STATUS_KINDS, Interval, IntervalKind

_RUN_COLUMNS = ("kind", "host_id", "shard_id", "job_id", "hqe_id", "start", "end")


def record_runs(hqes: list[dict[str, Any]]) -> int:
    """Opens or closes the run of each HQE that has started, in one statement whatever their number.

    `hqes` are the heartbeat's rows as applied (id, job_id, host, shard_id, started_on, finished_on).
    An upsert on the HQE makes a resent update, or one applied after its original, change nothing."""
    runs = []
    for hqe in hqes:
        start, end = hqe["started_on"], hqe["finished_on"]
        if start is None or hqe["host"] is None:
            continue
        runs.append((hqe, start, None if end is None else max(start, end)))
    if not runs:
        return 0
    field = Interval._meta.get_field("start")

    def prep(value: datetime | None) -> Any:
        return None if value is None else field.get_db_prep_value(value, connection)

    payload = [
        {
            "kind": IntervalKind.RUN.value,
            "host_id": hqe["host"],
            "shard_id": hqe["shard_id"],
            "job_id": hqe["job_id"],
            "hqe_id": hqe["id"],
            "start": prep(start),
            "end": prep(end),
        }
        for hqe, start, end in runs
    ]
    qn = connection.ops.quote_name
    table = qn(Interval._meta.db_table)
    columns = ", ".join(qn(c) for c in _RUN_COLUMNS)
    picked = ", ".join(f"v.{qn(c)}" for c in _RUN_COLUMNS)
    conflict = f"ON CONFLICT ({qn('hqe_id')}) DO UPDATE SET " + ", ".join(
        f"{qn(c)} = excluded.{qn(c)}" for c in ("host_id", "start", "end")
    )
    if connection.vendor == "postgresql":
        record = ", ".join(
            f"{qn(c)} {'timestamptz' if c in ('start', 'end') else 'text' if c == 'kind' else 'bigint'}"
            for c in _RUN_COLUMNS
        )
        source = f"jsonb_to_recordset(%s::jsonb) AS v({record})"
    elif connection.vendor == "sqlite":
        picks = ", ".join(f"value ->> '$.{c}' AS {qn(c)}" for c in _RUN_COLUMNS)
        source = f"(SELECT {picks} FROM json_each(%s)) AS v"
    else:  # pragma: no cover - only the two supported databases
        raise NotImplementedError(connection.vendor)
    # "WHERE true": SQLite's grammar needs it between an INSERT's SELECT and its ON CONFLICT.
    sql = f"INSERT INTO {table} ({columns}) SELECT {picked} FROM {source} WHERE true {conflict}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(payload, default=_json_default)])
    return len(runs)


def close_open_intervals(shard: Shard, at: datetime) -> int:
    """Ends the open intervals of a shard whose database was replaced, at `at`: its runs' HQEs failed
    then, and its hosts' Cleaning or Repairing would never end (the new database sends an event only
    when a status changes), overlapping every later run of the host."""
    return Interval.objects.filter(shard=shard, end__isnull=True).update(end=Greatest(F("start"), Value(at)))


@dataclass(frozen=True)
class HostChange:
    """A host's status became `status` at `at` (a shard's host event)."""

    host_id: int
    status: str
    at: datetime
    shard_id: int | None = None


def record_host_changes(changes: list[HostChange]) -> list[Interval | None]:
    """Applies host status changes in order, in at most four queries whatever their number: their hosts'
    intervals from the earliest change on are read once, replayed in memory, and written back (one
    DELETE, one UPDATE, one INSERT). Returns, per change, the interval it opened or found (unsaved
    when new, and possibly removed by a later change), or None.

    A host's status from `at` until the next thing known about the host becomes `status`:
    Cleaning, Repairing and Repair Failed open an interval, Ready and Running end the one open then.
    So a duplicate changes nothing, changes may come out of time order, and no two intervals of a
    host ever partially overlap. A status reported while a run holds the host starts when the run
    ends (and is dropped while that run is still open: its end comes with the HQE's update).
    Callers serialise the changes of one host (the heartbeat holds its shard's row)."""
    if not changes:
        return []
    earliest: dict[int, datetime] = {}
    for c in changes:
        earliest[c.host_id] = min(c.at, earliest.get(c.host_id, c.at))
    # Each host's intervals from its own earliest change: one stale event reads one host's history. A
    # CASE, not an OR per host: SQLite refuses an expression a thousand ORs deep.
    since = Case(*(When(host_id=h, then=Value(at)) for h, at in earliest.items()), output_field=DateTimeField())
    known = Interval.objects.filter(host_id__in=earliest).filter(Q(end__isnull=True) | Q(end__gte=since))
    by_host: dict[int, list[Interval]] = {}
    for interval in known:
        by_host.setdefault(interval.host_id, []).append(interval)
    histories = {host_id: _History(intervals) for host_id, intervals in by_host.items()}
    dirty: dict[int, Interval] = {}
    gone: set[int] = set()
    new: list[Interval] = []
    found = [_replay(histories.setdefault(c.host_id, _History([])), c, dirty, gone, new) for c in changes]
    if gone:
        Interval.objects.filter(id__in=gone).delete()
    bulk_set(Interval, [{"id": i.id, "end": i.end} for key, i in dirty.items() if key not in gone], ["end"])
    bulk_insert(
        Interval,
        [{"kind": i.kind, "host": i.host_id, "shard": i.shard_id, "start": i.start, "end": i.end} for i in new],
        ["kind", "host", "shard", "start", "end"],
    )
    return found


class _History:
    """A host's intervals in memory, sorted by start, so that one change costs a search and a look at
    the intervals near its time, not a pass over the host's whole history: a thousand stale events
    against a host with 20,000 intervals took 7.9 s that way."""

    def __init__(self, intervals: list[Interval]) -> None:
        self.items = sorted(intervals, key=lambda i: i.start)
        self.starts = [i.start for i in self.items]
        self.open = [i for i in self.items if i.end is None]
        # No ended interval is longer: one ending after `at` starts after `at - longest`. Only grows.
        self.longest = max((i.end - i.start for i in self.items if i.end is not None), default=timedelta(0))

    def add(self, interval: Interval) -> None:
        at = bisect.bisect_right(self.starts, interval.start)
        self.items.insert(at, interval)
        self.starts.insert(at, interval.start)
        if interval.end is None:
            self.open.append(interval)
        else:
            self.longest = max(self.longest, interval.end - interval.start)

    def remove(self, interval: Interval) -> None:
        at = bisect.bisect_left(self.starts, interval.start)
        while self.items[at] is not interval:
            at += 1
        del self.items[at], self.starts[at]
        if interval.end is None:
            self.open.remove(interval)

    def end(self, interval: Interval, at: datetime) -> None:
        if interval.end is None:
            self.open.remove(interval)
        interval.end = at
        self.longest = max(self.longest, at - interval.start)

    def holding(self, at: datetime) -> list[Interval]:
        """The intervals under way at `at`, in start order."""
        found = [i for i in self.open if i.start <= at]
        lowest = at - self.longest
        index = bisect.bisect_right(self.starts, at) - 1
        while index >= 0 and self.starts[index] >= lowest:
            interval = self.items[index]
            if interval.end is not None and interval.end > at:
                found.append(interval)
            index -= 1
        return sorted(found, key=lambda i: i.start)

    def starting_at(self, at: datetime) -> list[Interval]:
        index = bisect.bisect_left(self.starts, at)
        found = []
        while index < len(self.starts) and self.starts[index] == at:
            found.append(self.items[index])
            index += 1
        return found

    def next_start(self, after: datetime) -> datetime | None:
        index = bisect.bisect_right(self.starts, after)
        return self.starts[index] if index < len(self.starts) else None


def _replay(
    mine: _History, c: HostChange, dirty: dict[int, Interval], gone: set[int], new: list[Interval]
) -> Interval | None:
    """One change against the host's intervals in memory (`mine`, kept without the removed ones)."""

    def cut(interval: Interval, at: datetime) -> None:
        if interval.start >= at:
            mine.remove(interval)
            if interval.id is None:
                new.remove(interval)
            else:
                gone.add(interval.id)
        else:
            mine.end(interval, at)
            if interval.id is not None:
                dirty[interval.id] = interval

    at = c.at
    holding = mine.holding(at)
    current = next((i for i in holding if i.kind != IntervalKind.RUN), None)
    run = next((i for i in holding if i.kind == IntervalKind.RUN), None)
    if c.status not in STATUS_KINDS:
        if current is not None:
            cut(current, at)
        return None
    if current is not None and current.kind == c.status:
        return current
    start, old_end = at, None
    if run is not None:
        if run.end is None:
            return None
        start = run.end
        there = next((i for i in mine.starting_at(start) if i.kind != IntervalKind.RUN), None)
        if there is not None:
            return there if there.kind == c.status else None
    elif current is not None:
        old_end = current.end
        cut(current, at)
    following = mine.next_start(start)
    ends = [t for t in (old_end, following) if t is not None]
    end = min(ends) if ends else None
    if end is not None and end <= start:
        return None
    opened = Interval(kind=c.status, host_id=c.host_id, shard_id=c.shard_id, start=start, end=end)
    mine.add(opened)
    new.append(opened)
    return opened


@transaction.atomic
def record_host_status(host: Host | int, status: str, at: datetime, *, shard: Shard | int | None) -> Interval | None:
    """One host status change (see record_host_changes), checked; returns the interval it opened or found."""
    if status not in HostStatus.ALL:
        raise FleetshardError(f"unknown host status {status!r}: use one of {', '.join(HostStatus.ALL)}", field="status")
    if at.tzinfo is None:
        raise FleetshardError("the time of a host status change needs a time zone", field="at")
    host_id = host if isinstance(host, int) else host.id
    shard_id = shard if isinstance(shard, int) or shard is None else shard.id
    # The host's row lock serialises the changes of one host.
    if not Host.objects.select_for_update().filter(id=host_id).exists():
        raise NotFound(f"unknown host {host_id}", field="host")
    (interval,) = record_host_changes([HostChange(host_id, status, at, shard_id)])
    if interval is None or interval.id is not None:
        return interval
    return Interval.objects.filter(host_id=host_id, kind=interval.kind, start=interval.start).first()
