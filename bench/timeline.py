"""Timeline export at scale: N intervals (default 1,000,000) generated in the database, exported to a
gzipped Chrome trace by a child process; prints the time, the child's CPU time (the database's work
is not in it), the file's size and the child's peak memory (ru_maxrss, and before the export
started), then checks the file with the streaming validator. It exports twice: reading every
interval (no day built yet), then once the closed days are built (master/timeline/days.py, what
`serve`'s builder thread does an hour after each day ends; the time that takes is printed too), the
way an export of a fleet's history runs. Last, what the triggers that keep built days true cost an
HQE's status change (the heartbeat's), in a transaction rolled back: 100,000 HQEs whose runs started
on an old day (each marks its day unbuilt) and today (each only looks), against the triggers off.

Run: `DATABASE_URL=postgres://.../THROWAWAY .venv/bin/python bench/timeline.py [--intervals N]`.
PostgreSQL only (the rows are made with generate_series); the database is migrated and filled.
Targets for 1,000,000 intervals: under 3 s and under 150 MB peak memory (issue 30), at most 10 MB
gzipped (issue 12). The machine's load shows in the time: report `uptime` with it.
"""

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.support import setup_django  # noqa: E402

setup_django("master")

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from master import services  # noqa: E402
from master.timeline import days  # noqa: E402
from master.timeline.export import write_trace  # noqa: E402
from master.timeline.models import Interval, TraceDay  # noqa: E402
from master.timeline.query import scope  # noqa: E402
from tests.master.timeline.validate import Validator, iter_events  # noqa: E402

SHARDS, HOSTS_PER_SHARD, SLOT_S = 4, 50, 600

FILL = """
WITH h AS (SELECT id, shard_id, row_number() OVER (ORDER BY id) - 1 AS i FROM common_host WHERE hostname LIKE 'tl-%%'),
g AS (SELECT n, (n - 1) / %(hosts)s AS slot, (n - 1) %% %(hosts)s AS hi FROM generate_series(1, %(runs)s) AS n),
r AS (
  SELECT g.n, h.id AS host_id, h.shard_id,
         %(t0)s::timestamptz + make_interval(secs => g.slot * %(slot)s + 10) AS started,
         %(t0)s::timestamptz + make_interval(secs => g.slot * %(slot)s + 10 + 120 + (g.n * 37) %% 300) AS finished,
         %(t0)s::timestamptz + make_interval(secs => g.slot * %(slot)s + 10 - (g.n * 13) %% 600) AS created
  FROM g JOIN h ON h.i = g.hi
), jobs AS (
  INSERT INTO common_job (id, name, owner, priority, command, timeout_mins, max_runtime_mins, keyvals, aborted,
                          shard_id, version, created_on, status, suite_keyvals, ab, inputs)
  SELECT n, 'bench-' || (n %% 500), 'owner' || (n %% 7), 50, 'true', 30, 60, '{}', false, shard_id, 1, created,
         CASE WHEN n %% 10 = 0 THEN 'Failed' ELSE 'Completed' END, '{}', '{}', '[]' FROM r
), hqes AS (
  INSERT INTO common_hostqueueentry (id, job_id, host_id, status, failure, exit_code, started_on, finished_on,
                                     log_tail, last_seq)
  SELECT n, n, host_id, CASE WHEN n %% 10 = 0 THEN 'Failed' ELSE 'Completed' END,
         CASE WHEN n %% 10 = 0 THEN 'test' ELSE '' END, CASE WHEN n %% 10 = 0 THEN 1 ELSE 0 END,
         started, finished, '', 1 FROM r
), runs AS (
  INSERT INTO master_interval (kind, host_id, shard_id, job_id, hqe_id, start, "end")
  SELECT 'run', host_id, shard_id, n, n, started, finished FROM r
)
INSERT INTO master_interval (kind, host_id, shard_id, job_id, hqe_id, start, "end")
SELECT CASE WHEN n %% 5 = 0 THEN 'Repairing' ELSE 'Cleaning' END, host_id, shard_id, NULL, NULL, finished,
       finished + make_interval(secs => CASE WHEN n %% 5 = 0 THEN 90 ELSE 30 END) FROM r
"""


def fill(intervals: int) -> None:
    call_command("migrate", verbosity=0)
    if Interval.objects.filter(host__hostname__startswith="tl-").exists():
        print("reusing the bench fleet already in the database")
        with connection.cursor() as cursor:  # what the last run's rolled-back updates left
            cursor.execute("VACUUM ANALYZE common_hostqueueentry, master_interval, common_job")
        return
    for s in range(SHARDS):
        label = f"board:tl{s}"
        services.create_labels([label], acting_user=None)
        services.create_shard(f"tl-shard{s}", [label], acting_user=None)
        services.create_hosts([f"tl-{s}-{h:02d}" for h in range(HOSTS_PER_SHARD)], labels=[label], acting_user=None)
    hosts = SHARDS * HOSTS_PER_SHARD
    runs = intervals // 2
    t0 = timezone.now() - timezone.timedelta(seconds=(runs // hosts + 1) * SLOT_S)
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"hosts": hosts, "runs": runs, "t0": t0, "slot": SLOT_S})
        for table in ("common_job", "common_hostqueueentry"):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT MAX(id) FROM {table}))")
        cursor.execute("ANALYZE")


def child(path: str) -> None:
    """The export alone, in a fresh process, so its peak memory is its own."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    size = write_trace(scope(timezone.now()), Path(path))
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures = {"seconds": elapsed, "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu, "bytes": size}
    print(json.dumps({**figures, "rss_before_kb": before, "rss_peak_kb": usage.ru_maxrss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=1_000_000)
    parser.add_argument("--child", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if connection.vendor != "postgresql":
        sys.exit("bench/timeline.py needs DATABASE_URL=postgres://... (a throwaway database)")
    started = time.perf_counter()
    fill(args.intervals)
    print(f"generated {args.intervals} intervals in {time.perf_counter() - started:.1f} s")
    TraceDay.objects.all().delete()
    whole = export("no day built")
    started = time.perf_counter()
    built = 0
    while True:
        done, left = days.build_due()
        built += done
        if not left:
            break
    print(f"built {built} days in {time.perf_counter() - started:.1f} s (what serve's builder thread does)")
    spliced = export(f"{built} days built")
    targets = spliced["seconds"] < 3 and spliced["bytes"] <= 10e6 and spliced["rss_peak_kb"] < 150 * 1024
    print(
        "targets (< 3 s, <= 10 MB, < 150 MB), days built:",
        "met" if targets else "MISSED",
        f"({whole['seconds']:.1f} s with no day built)",
        "- load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
    )
    trigger_cost()


TRIGGERS = ("master_hqe_changed_update", "master_interval_changed_update")  # off while it moves the runs


def trigger_cost(rows: int = 100_000) -> None:
    """Microseconds per HQE status change with the built days' triggers and without, rolled back."""

    def timed(cursor: Any) -> float:
        started = time.perf_counter()
        cursor.execute("UPDATE common_hostqueueentry SET status = 'Aborted' WHERE id <= %s", [rows])
        cursor.execute("UPDATE common_hostqueueentry SET status = 'Completed' WHERE id <= %s", [rows])
        return (time.perf_counter() - started) / (2 * rows) * 1e6

    def triggers(cursor: Any, on: bool) -> None:
        for name, table in zip(TRIGGERS, ("common_hostqueueentry", "master_interval"), strict=True):
            cursor.execute(f"ALTER TABLE {table} {'ENABLE' if on else 'DISABLE'} TRIGGER {name}")

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no foreign key check left pending for ALTER TABLE
        old = timed(cursor)
        triggers(cursor, False)
        off = timed(cursor)
        cursor.execute("UPDATE common_hostqueueentry SET started_on = now() WHERE id <= %s", [rows])
        cursor.execute('UPDATE master_interval SET start = now(), "end" = now() WHERE hqe_id <= %s', [rows])
        triggers(cursor, True)
        today = timed(cursor)
        transaction.set_rollback(True)
    print(
        f"an HQE status change: {off:.1f} us without the triggers, {today:.1f} us with them (today's run), "
        f"{old:.1f} us (an old day's run: it notes a change to its day); {rows} rows, rolled back"
    )


def export(what: str) -> dict[str, float]:
    """Exports in a child process, prints its figures, validates the file; returns the figures."""
    out = Path(tempfile.mkdtemp(prefix="fleetshard-timeline-")) / "fleet.json.gz"
    done = subprocess.run([sys.executable, __file__, "--child", str(out)], capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"export, {what}: {figures['seconds']:.1f} s ({figures['cpu_seconds']:.1f} s CPU in this process), "
        f"{figures['bytes'] / 1e6:.2f} MB gzipped, peak RSS "
        f"{figures['rss_peak_kb'] / 1024:.0f} MB (of which {figures['rss_before_kb'] / 1024:.0f} MB before the export)"
    )
    started = time.perf_counter()
    validator = Validator()
    with gzip.open(out, "rt", encoding="utf-8") as stream:
        for event in iter_events(stream):
            validator.feed(event)
    summary = validator.finish()
    print(
        f"  valid: {summary.slices} slices on {summary.threads} threads, {summary.counters} counter events "
        f"(checked in {time.perf_counter() - started:.1f} s)"
    )
    out.unlink()
    return figures


if __name__ == "__main__":
    main()
