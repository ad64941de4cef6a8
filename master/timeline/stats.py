"""Totals per host, label or shard over a window (docs/design.md, "Timelines"), computed in the database:
three queries (the clipped sums, the hosts counted, the queue waits) whatever the intervals' number.

Idle is what the hosts' window leaves after their intervals, a host's window starting no earlier than
its creation (Host.created_on). The queue wait of a run is its job's
creation to its HQE's start: p50 and p95 are percentile_cont on PostgreSQL, the nearest rank on
SQLite (which has no percentile function).
"""

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, DateTimeField, F, Q, Sum, Value
from django.db.models.functions import Greatest

from common.errors import FleetshardError
from common.models import Host, Shard
from master.timeline.models import IntervalKind
from master.timeline.query import Scope, Seconds, selected

BY = ("host", "label", "shard")
DEFAULT_WINDOW = timedelta(hours=24)
_KEYS = {"host": "host__hostname", "label": "host__labels__name", "shard": "shard__hostname"}
_HOST_KEYS = {"host": "hostname", "label": "labels__name", "shard": "shard__hostname"}
_SUMS = {
    "running_s": IntervalKind.RUN,
    "cleaning_s": IntervalKind.CLEANING,
    "repairing_s": IntervalKind.REPAIRING,
    "repair_failed_s": IntervalKind.REPAIR_FAILED,
}


def windowed(s: Scope) -> Scope:
    """Totals need a window: the last 24 hours unless `since` says otherwise."""
    if s.since is not None:
        return s
    return Scope(s.now, s.shards, s.label, s.jobs, s.end - DEFAULT_WINDOW, s.until)


def stats(s: Scope, by: str = "host") -> list[dict[str, Any]]:
    """One row per key, sorted by key: docs/design.md's fields, plus repair_failed_s."""
    if by not in BY:
        raise FleetshardError(f"invalid by {by!r}: use host, label or shard", field="by")
    s = windowed(s)
    assert s.since is not None
    window_s = max(0.0, (s.end - s.since).total_seconds())
    key = _KEYS[by]
    seconds = Seconds(F("clip_end"), F("clip_start"))
    sums: dict[str, Any] = {name: Sum(seconds, filter=Q(kind=kind)) for name, kind in _SUMS.items()}
    rows = {
        row["key"]: row
        for row in selected(s)
        .order_by()
        .values(key=F(key))
        .annotate(**sums, runs=Count("id", filter=Q(kind=IntervalKind.RUN)), hosts_seen=Count("host_id", distinct=True))
    }
    hosts = Host.objects.all()
    if s.shards:
        # By the shards' ids (a subquery), not a join on their names: the overview's page of 50
        # shards reads their hosts through Host's shard index, not all 100,000.
        hosts = hosts.filter(shard__in=Shard.objects.filter(hostname__in=s.shards).values("id"))
    if s.label is not None:
        hosts = hosts.filter(labels__name=s.label)
    # A host counts from the window's start or its creation, whichever is later: a lab made three
    # minutes ago has three minutes of capacity, not a day of idle.
    since, end = Value(s.since, DateTimeField()), Value(s.end, DateTimeField())
    existed = Greatest(Seconds(end, Greatest(since, F("created_on"))), Value(0.0))
    population = {
        row["key"]: (row["n"], float(row["existed_s"] or 0.0))
        for row in hosts.order_by()
        .values(key=F(_HOST_KEYS[by]))
        # A host is in one row per label it has, but once by host or shard: DISTINCT only by label.
        .annotate(n=Count("id", distinct=by == "label"), existed_s=Sum(existed))
    }
    waits = _waits(s, key)
    result = []
    for name in sorted(k for k in set(rows) | set(population) if k is not None):
        row = rows.get(name, {})
        busy = {field: float(row.get(field) or 0.0) for field in _SUMS}
        known_n, existed_s = population.get(name, (0, 0.0))
        hosts_n = max(known_n, row.get("hosts_seen", 0))
        # Hosts seen in intervals but gone since (deleted) count the whole window, as before.
        capacity = existed_s + (hosts_n - known_n) * window_s
        # Never less than what was busy: intervals older than a host's record (one deleted and made
        # again under its name) must not read as over 100% use.
        capacity = max(capacity, sum(busy.values()))
        p50, p95 = waits.get(name, (None, None))
        result.append(
            {
                "key": name,
                **{f: busy[f] for f in ("running_s", "cleaning_s", "repairing_s")},
                "idle_s": max(0.0, capacity - sum(busy.values())),
                "utilisation": busy["running_s"] / capacity if capacity else 0.0,
                "runs": row.get("runs", 0),
                "wait_p50_s": p50,
                "wait_p95_s": p95,
                "repair_failed_s": busy["repair_failed_s"],
                "hosts": hosts_n,
            }
        )
    return result


def _waits(s: Scope, key: str) -> dict[str, tuple[float | None, float | None]]:
    inner = (
        selected(s)
        .filter(kind=IntervalKind.RUN, job__isnull=False)
        .order_by()
        .values(key=F(key), wait=Seconds(F("start"), F("job__created_on")))
    )
    sql, params = inner.query.sql_with_params()
    if connection.vendor == "postgresql":
        outer = (
            "SELECT key, percentile_cont(0.5) WITHIN GROUP (ORDER BY wait), "
            f"percentile_cont(0.95) WITHIN GROUP (ORDER BY wait) FROM ({sql}) AS w GROUP BY key"
        )
    else:
        outer = (
            "SELECT key, MIN(CASE WHEN rn >= 0.5 * n THEN wait END), MIN(CASE WHEN rn >= 0.95 * n THEN wait END) "
            "FROM (SELECT key, wait, ROW_NUMBER() OVER (PARTITION BY key ORDER BY wait) AS rn, "
            f"COUNT(*) OVER (PARTITION BY key) AS n FROM ({sql}) AS w) AS r GROUP BY key"
        )
    with connection.cursor() as cursor:
        cursor.execute(outer, params)
        return {k: (p50, p95) for k, p50, p95 in cursor.fetchall()}


def utilisation_by_shard(now: datetime, shards: tuple[str, ...]) -> list[dict[str, Any]]:
    """The fleet overview's table: these shards (the overview's page of them) over the last 24 hours;
    none when `shards` is empty (where a Scope would mean every shard)."""
    return stats(Scope(now, shards=shards, since=now - DEFAULT_WINDOW), by="shard") if shards else []
