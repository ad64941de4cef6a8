"""The Chrome Trace Event export (docs/design.md, "Timelines"), written as it is read from the database.

Rows come from a server-side cursor in chunks and leave as text chunks, so a trace of millions of
intervals needs the memory of one chunk, not of the trace; built days (master.timeline.days) come
as pieces compressed beforehand. Times are microseconds since the epoch.
"""

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import F

from common.models import Host, Shard
from master.timeline import days
from master.timeline.deflate import Joiner, Packed
from master.timeline.limits import Deadline, end_quietly
from master.timeline.models import IntervalKind
from master.timeline.query import Scope, selected
from master.timeline.slices import NO_SHARD, Micros, slice_texts

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
TRACES_PER_FETCH = 2
FLUSH_CHARS = 1 << 16
# Level 7: a tenth smaller than 6 on a trace's repetitive lines, for a little more time (bench/timeline.py).
GZIP_LEVEL = 7
COUNTER_BUCKETS = 1000  # per shard: the counters' resolution, whatever the window's length
CUT_PID = (1 << 31) - 1  # the pid of the note of an export cut short at its deadline


def us(when: datetime) -> int:
    return (when - EPOCH) // ONE_US


def trace_events(s: Scope) -> Iterator[str]:
    """Each event of the trace as JSON text: metadata first, then counters, slices and jobs' events."""
    return cast(Iterator[str], _parts(s, batched=False))  # no built days: text only


def _parts(s: Scope, *, batched: bool, built: bool = False) -> Iterator[str | Packed]:
    """The events' JSON texts; `batched`: the slices come as runs of events joined by commas, and
    `built`: the built days the scope covers as their pieces (each event after a comma).

    All read from one snapshot on PostgreSQL: an interval the heartbeat writes meanwhile (a run on a
    host not yet named) would otherwise be a slice on a thread without a name, or a job's events
    without their run; a day marked unbuilt meanwhile is still built in it, with its old intervals."""
    with transaction.atomic():
        if connection.vendor == "postgresql" and _outermost():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rows = selected(s).order_by()
        pairs: set[tuple[int | None, int]] = set(rows.order_by().values_list("shard_id", "host_id").distinct())
        counters = _counters(s, {shard for shard, _ in pairs}) if pairs or s.shards else []
        shard_ids = {shard or NO_SHARD for shard, _ in pairs} | {shard for shard, *_ in counters}
        covered = days.covering(s) if built else []
        # One `yield from` each, not chain(): closing this generator (a reader gone, a deadline) must close
        # the one it is in, whose atomic block and server-side cursor would otherwise outlive this one's
        # and later end whatever transaction the thread's connection is in by then.
        yield from _metadata(shard_ids, pairs)
        yield from _counter_events(counters)
        yield from days.pieces(covered)
        yield from slice_texts(rows.exclude(days.spliced(covered)) if covered else rows, batched=batched)
        yield from _job_events(rows)


def _outermost() -> bool:
    """Whether the atomic block just entered began the transaction (a test's may hold an outer one)."""
    return not connection.savepoint_ids


def trace_pieces(s: Scope, deadline: Deadline | None = None) -> Iterator[str | Packed]:
    """The trace as text chunks and built days' pieces; their texts joined, one JSON object. Past
    `deadline` it ends early, still whole, its transaction ended, with the reason in `otherData` and
    as a process named for it."""
    buffer, size, first = ['{"traceEvents":['], 0, True

    def pack(event: str | Packed) -> list[str | Packed]:
        nonlocal buffer, size, first
        if isinstance(event, Packed) and not first:
            out: list[str | Packed] = ["".join(buffer), event]
            buffer, size = [], 0
            return out
        text = event.text()[1:] if isinstance(event, Packed) else event  # (a piece's events follow commas)
        piece = text if first else "," + text
        first = False
        buffer.append(piece)
        size += len(piece)
        if size < FLUSH_CHARS:
            return []
        chunk, buffer, size = "".join(buffer), [], 0
        return [chunk]

    cut = yield from (deadline or Deadline.never()).chunks(_parts(s, batched=True, built=True), pack)
    if cut:
        buffer.append(("" if first else ",") + cut_event(cut))
    other = f',"otherData":{{"cut_short":{json.dumps(cut)}}}' if cut else ""
    buffer.append(f'],"displayTimeUnit":"ms"{other}}}\n')
    yield "".join(buffer)


def trace_chunks(s: Scope, deadline: Deadline | None = None) -> Iterator[str]:
    """The trace as text, chunk by chunk; joined, one JSON object (trace_pieces, the pieces inflated)."""
    chunks = trace_pieces(s, deadline)
    try:
        for chunk in chunks:
            yield chunk.text() if isinstance(chunk, Packed) else chunk
    finally:
        end_quietly(chunks)


def cut_event(note: str) -> str:
    """A process named for why the export was cut short, where a trace viewer shows it first."""
    name = json.dumps(note)
    return (
        f'{{"name":"process_name","ph":"M","pid":{CUT_PID},"tid":0,"args":{{"name":{name}}}}},'
        f'{{"name":"process_sort_index","ph":"M","pid":{CUT_PID},"tid":0,"args":{{"sort_index":-1}}}}'
    )


def _metadata(shard_ids: set[int], pairs: set[tuple[int | None, int]]) -> Iterator[str]:
    shards = dict(Shard.objects.filter(id__in=shard_ids).values_list("id", "hostname"))
    hosts = dict(Host.objects.filter(id__in={h for _, h in pairs}).values_list("id", "hostname"))
    for rank, pid in enumerate(sorted(shard_ids, key=lambda i: (i == NO_SHARD, shards.get(i, ""), i))):
        name = json.dumps(shards.get(pid, "(no shard)" if pid == NO_SHARD else f"shard {pid}"))
        yield f'{{"name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":{name}}}}}'
        yield f'{{"name":"process_sort_index","ph":"M","pid":{pid},"tid":0,"args":{{"sort_index":{rank}}}}}'
    threads = sorted(pairs, key=lambda p: (hosts.get(p[1], ""), p[1]))
    for rank, (shard, host) in enumerate(threads):
        pid = shard or NO_SHARD
        name = json.dumps(hosts.get(host, f"host {host}"))
        yield f'{{"name":"thread_name","ph":"M","pid":{pid},"tid":{host},"args":{{"name":{name}}}}}'
        yield f'{{"name":"thread_sort_index","ph":"M","pid":{pid},"tid":{host},"args":{{"sort_index":{rank}}}}}'


def _job_events(rows: Any) -> Iterator[str]:
    """The events of the jobs' own traces (master.timeline.jobtrace), shifted to start with their run
    and clipped to its slice (as the window clipped it), so they nest inside it on the host's thread."""
    traced = (
        rows.filter(kind=IntervalKind.RUN, hqe__trace__isnull=False)
        .annotate(s0=Micros(F("start")), lo=Micros(F("clip_start")), hi=Micros(F("clip_end")))
        .values_list("shard_id", "host_id", "s0", "lo", "hi", "hqe__trace__events")
    )
    # Two at a time: a trace may be MAX_TRACE_EVENTS long-named events, about 5 MB once read.
    for shard, host, start, low, high, events in traced.iterator(chunk_size=TRACES_PER_FETCH):
        head = f',"cat":"job","ph":"X","pid":{shard or NO_SHARD},"tid":{host},"ts":'
        for name, cat, ts, dur in events if isinstance(events, list) else ():
            begin, end = max(low, start + ts), min(high, start + ts + dur)
            if end < begin or (end == begin and dur > 0):
                continue
            args = f',"args":{{"cat":{json.dumps(cat)}}}' if cat else ""
            yield f'{{"name":{json.dumps(name)}{head}{begin},"dur":{end - begin}{args}}}'


def _epoch_sql(column: str) -> str:
    if connection.vendor == "postgresql":
        return f"date_part('epoch', {column})"
    return f"((julianday({column}) - 2440587.5) * 86400.0)"


def _in(values: tuple[Any, ...]) -> str:
    return "(" + ", ".join(["%s"] * len(values)) + ")"


def _counters(s: Scope, shard_ids: set[int | None]) -> list[tuple[int, datetime, int, int]]:
    """Per shard and time bucket: when its last change happened and the changes of its queued and
    running HQEs. Bucketed in the database, so a long window costs at most COUNTER_BUCKETS events."""
    qn = connection.ops.quote_name
    hqe, job = qn("common_hostqueueentry"), qn("common_job")
    where = [f"{job}.{qn('shard_id')} IS NOT NULL"]
    params: list[Any] = []
    if s.shards:
        where.append(
            f"{job}.{qn('shard_id')} IN (SELECT id FROM {qn('common_shard')} WHERE hostname IN {_in(s.shards)})"
        )
        params.extend(s.shards)
    elif shard_ids:
        ids = tuple(i for i in shard_ids if i is not None) or (0,)
        where.append(f"{job}.{qn('shard_id')} IN {_in(ids)}")
        params.extend(ids)
    if s.jobs:
        where.append(f"{job}.id IN {_in(s.jobs)}")
        params.extend(s.jobs)
    base = f"FROM {hqe} JOIN {job} ON {job}.id = {hqe}.{qn('job_id')} WHERE " + " AND ".join(where)
    shard = f"{job}.{qn('shard_id')}"
    started, finished, created = (
        f"{hqe}.{qn('started_on')}",
        f"{hqe}.{qn('finished_on')}",
        f"{job}.{qn('created_on')}",
    )
    # One scan: each HQE gives three changes (created, started, finished), paired with a constant table.
    kinds = "(SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2) AS kinds"
    changes = (
        f"SELECT {shard} AS s, CASE k WHEN 0 THEN {created} WHEN 1 THEN {started} ELSE {finished} END AS t, "
        f"CASE k WHEN 0 THEN 1 WHEN 1 THEN -1 WHEN 2 THEN (CASE WHEN {started} IS NULL THEN -1 ELSE 0 END) END AS dq, "
        f"CASE k WHEN 0 THEN 0 WHEN 1 THEN 1 WHEN 2 THEN (CASE WHEN {started} IS NULL THEN 0 ELSE -1 END) END AS dr "
        f"{base.replace(' WHERE ', f' CROSS JOIN {kinds} WHERE ', 1)}"
    )
    origin = s.since
    if origin is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT MIN({created}) {base}", params)
            found = cursor.fetchone()[0]
        if found is None:
            return []
        origin = found if isinstance(found, datetime) else _parse(found)
    width = max((s.end - origin).total_seconds() / COUNTER_BUCKETS, 1e-3)
    since_param = _db_time(origin)
    bucket = (
        f"CASE WHEN t < %s THEN -1 ELSE CAST(FLOOR(({_epoch_sql('t')} - {_epoch_sql('%s')}) / %s) AS BIGINT) END"
        if connection.vendor == "postgresql"
        else f"CASE WHEN t < %s THEN -1 ELSE CAST(({_epoch_sql('t')} - {_epoch_sql('%s')}) / %s AS INTEGER) END"
    )
    # OFFSET 0 hides the changes' times from the planner's statistics: seeing a time per HQE, it expected
    # a group per change and sorted all 1.5M of them (on disk, in parallel workers), where hashing
    # the few thousand buckets takes a third of the CPU. SQLite has no such planner (and wants a LIMIT).
    fence = " OFFSET 0" if connection.vendor == "postgresql" else ""
    sql = (
        f"SELECT s, b, MAX(t), SUM(dq), SUM(dr) FROM (SELECT s, t, dq, dr, {bucket} AS b FROM ({changes}{fence}) AS c "
        f"WHERE t IS NOT NULL AND t < %s) AS d GROUP BY s, b ORDER BY s, b"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [since_param, since_param, width, *params, _db_time(s.end)])
        rows = cursor.fetchall()
    # Changes before the window only set where the counts start: shown at the window's start.
    return [
        (shard_id, origin if b < 0 else t if isinstance(t, datetime) else _parse(t), int(dq), int(dr))
        for shard_id, b, t, dq, dr in rows
    ]


def _db_time(when: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(when)


def _parse(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _counter_events(counters: list[tuple[int, datetime, int, int]]) -> Iterator[str]:
    shard, queued, running = None, 0, 0
    for shard_id, t, dq, dr in counters:
        if shard_id != shard:
            shard, queued, running = shard_id, 0, 0
        queued, running = queued + dq, running + dr
        yield (
            f'{{"name":"HQEs","ph":"C","pid":{shard_id},"tid":0,"ts":{us(t)},'
            f'"args":{{"queued":{max(0, queued)},"running":{max(0, running)}}}}}'
        )


def write_trace(s: Scope, path: Path) -> int:
    """Writes the trace to `path` (gzipped when it ends .gz); returns the bytes written."""
    with open(path, "wb") as out:
        if path.name.endswith(".gz"):
            for data in gzipped(trace_pieces(s)):
                out.write(data)
        else:
            for chunk in trace_chunks(s):
                out.write(chunk.encode())
    return path.stat().st_size


def gzipped(chunks: Iterable[str | Packed]) -> Iterator[bytes]:
    """One gzip stream of `chunks`, text compressed as it comes, pieces spliced in (master.timeline.deflate)."""
    joiner = Joiner(GZIP_LEVEL)
    try:
        for chunk in chunks:
            data = joiner.piece(chunk) if isinstance(chunk, Packed) else joiner.text(chunk)
            if data:
                yield data
    finally:
        end_quietly(iter(chunks))
    yield joiner.finish()
