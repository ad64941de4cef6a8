"""The Chrome Trace Event export (DESIGN.md, "Timelines"), written as it is read from the database.

Rows come from a server-side cursor in chunks and leave as text chunks, so a trace of millions of
intervals needs the memory of one chunk, not of the trace. Times are microseconds since the epoch.
"""

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from itertools import chain
from pathlib import Path
from typing import Any

from django.db import connection

from common.models import Host, Shard
from master.timeline.models import IntervalKind
from master.timeline.query import Scope, selected

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)
CHUNK_ROWS = 5000
FLUSH_CHARS = 1 << 16
COUNTER_BUCKETS = 1000  # per shard: the counters' resolution, whatever the window's length
NO_SHARD = 0  # the pid of intervals whose shard was deleted


def us(when: datetime) -> int:
    return (when - EPOCH) // ONE_US


def trace_chunks(s: Scope) -> Iterator[str]:
    """The trace as text, chunk by chunk; joined, one JSON object."""
    rows = selected(s).order_by("start", "id")
    pairs: set[tuple[int | None, int]] = set(rows.order_by().values_list("shard_id", "host_id").distinct())
    counters = _counters(s, {shard for shard, _ in pairs}) if pairs or s.shards else []
    shard_ids = {shard or NO_SHARD for shard, _ in pairs} | {shard for shard, *_ in counters}
    events = chain(_metadata(shard_ids, pairs), _counter_events(counters), _slices(rows))
    buffer, size = ['{"traceEvents":['], 0
    for n, event in enumerate(events):
        piece = event if n == 0 else ",\n" + event
        buffer.append(piece)
        size += len(piece)
        if size >= FLUSH_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    buffer.append('],"displayTimeUnit":"ms"}\n')
    yield "".join(buffer)


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


def _slices(rows: Any) -> Iterator[str]:
    fields = (
        "kind",
        "clip_start",
        "clip_end",
        "shard_id",
        "host_id",
        "job_id",
        "hqe_id",
        "job__name",
        "job__owner",
        "hqe__status",
        "hqe__failure",
        "hqe__exit_code",
    )
    run = IntervalKind.RUN.value
    dumps = json.dumps
    for kind, start, end, shard, host, job, hqe, name, owner, status, failure, exit_code in rows.values_list(
        *fields
    ).iterator(chunk_size=CHUNK_ROWS):
        ts = us(start)
        dur = max(0, us(end) - ts)
        pid = shard or NO_SHARD
        if kind == run:
            code = "null" if exit_code is None else exit_code
            yield (
                f'{{"name":{dumps(name if name is not None else f"job {job}")},"cat":"run","ph":"X","pid":{pid},'
                f'"tid":{host},"ts":{ts},"dur":{dur},"args":{{"job":{job},"hqe":{hqe},"owner":{dumps(owner)},'
                f'"status":{dumps(status)},"failure":{dumps(failure or "")},"exit_code":{code}}}}}'
            )
        else:
            yield f'{{"name":{dumps(kind)},"cat":"host","ph":"X","pid":{pid},"tid":{host},"ts":{ts},"dur":{dur}}}'


def _epoch_sql(column: str) -> str:
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})"
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
    changes = " UNION ALL ".join(
        [
            f"SELECT {shard} AS s, {created} AS t, 1 AS dq, 0 AS dr {base}",
            f"SELECT {shard}, {started}, -1, 1 {base} AND {started} IS NOT NULL",
            f"SELECT {shard}, {finished}, 0, -1 {base} AND {started} IS NOT NULL AND {finished} IS NOT NULL",
            f"SELECT {shard}, {finished}, -1, 0 {base} AND {started} IS NULL AND {finished} IS NOT NULL",
        ]
    )
    params = params * 4
    origin = s.since
    if origin is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT MIN(t) FROM ({changes}) AS c", params)
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
    sql = (
        f"SELECT s, b, MAX(t), SUM(dq), SUM(dr) FROM (SELECT s, t, dq, dr, {bucket} AS b FROM ({changes}) AS c "
        f"WHERE t < %s) AS d GROUP BY s, b ORDER BY s, b"
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
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as out:
        for chunk in trace_chunks(s):
            out.write(chunk)
    return path.stat().st_size


def gzipped(chunks: Iterable[str]) -> Iterator[bytes]:
    """A gzip stream of `chunks`, compressed as they come."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    for chunk in chunks:
        data = packer.compress(chunk.encode())
        if data:
            yield data
    yield packer.flush()
