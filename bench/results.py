"""Benchmark results at scale, on PostgreSQL: the upload endpoint's ingest rate and the time of
"recent timings of one entry" with a million entries (issue 11's targets: at least 5,000 entries/s
and under 20 ms).

Run: `.venv/bin/python bench/results.py [--files 200] [--entries-per-file 100] [--threads 4]
[--rows 1000000] [--ingest-only]` with DATABASE_URL naming any database of a PostgreSQL server (default
postgres://postgres@127.0.0.1:5432/postgres). It creates a database of its own, migrates it, starts a
real master (`manage.py serve`, 2 workers) and:
1. uploads `--files` result files through POST /api/v1/results/upload from `--threads` threads
   (each file a new run of one of 5 tests, so regression detection runs on growing series) and
   prints entries per second, end to end; the CPU per file of the master, its PostgreSQL
   backends and this client (what bounds the rate on a quiet machine); and how long after the last
   upload the master's detector threads (not the requests) had read every series the uploads marked
   (`--ingest-only` stops after the rate and the CPU);
2. loads `--rows` more entries with COPY (10 tests x 100 entries, so 1,000 runs of each test, spread over a year), runs
   ANALYZE, then times the query GET /api/v1/results/timings/ runs (the newest 100 timings of one
   entry, with host and job), in-process and through the endpoint, and prints its EXPLAIN ANALYZE.
The database is dropped at the end unless --keep.
"""

import argparse
import io
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import (  # noqa: E402
    CPU_OF,
    DEFAULT_PG,
    Service,
    admin_connection,
    cpu_seconds,
    create_database,
    manage_argv,
)
from tests.support import Role, free_port, wait_until  # noqa: E402

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TESTS_BULK = 10
ENTRIES_BULK = 100


def result_file(test: str, start: datetime, n: int, rng: random.Random) -> bytes:
    entries = [
        {"name": f"BM_case_{j}", "iters": 1000, "wallTime": rng.uniform(0.9, 1.1) * (j + 1) * 1e-4, "cpuTime": 1e-4}
        for j in range(n)
    ]
    doc = {"name": test, "startTime": start.timestamp(), "entries": {"entry": entries}, "commitId": {"hash": "0" * 40}}
    return json.dumps(doc).encode()


def ingest(url: str, token: str, files: int, per_file: int, threads: int) -> tuple[float, int]:
    rng = random.Random(1)
    bodies = [result_file(f"ingest_{i % 5}", T0 + timedelta(minutes=i), per_file, rng) for i in range(files)]
    todo = list(enumerate(bodies))
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        while True:
            with lock:
                if not todo:
                    return
                i, body = todo.pop(0)
            resp = session.post(f"{url}/api/v1/results/upload", params={"name": f"{i}.json"}, data=body, timeout=60)
            if resp.status_code != 201:
                failures.append(f"{i}: {resp.status_code} {resp.text[:200]}")

    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit("uploads failed: " + "; ".join(failures[:5]))
    return elapsed, files * per_file


def bulk_load(conn: object, rows: int) -> None:
    """COPY `rows` entries: TESTS_BULK tests x ENTRIES_BULK entries, each run a file of one test."""
    runs_per_test = max(1, rows // (TESTS_BULK * ENTRIES_BULK))
    step = timedelta(days=365) / runs_per_test
    cur = conn.cursor()  # type: ignore[attr-defined]
    buf = io.StringIO()
    now = datetime.now(UTC).isoformat()
    for t in range(TESTS_BULK):
        for r in range(runs_per_test):
            start = (T0 + step * r + timedelta(seconds=t)).isoformat()
            buf.write(
                f"bulk_{t}\t{start}\t{{}}\ttensorflow\t{t:08x}{r:056x}\tboard:b{r % 3}\t[]\t{ENTRIES_BULK}\t{now}\n"
            )
    buf.seek(0)
    cur.copy_expert(
        "COPY master_testrun (test, start, info, format, digest, label, labels, entry_count, created_on) FROM STDIN",
        buf,
    )
    cur.execute("SELECT id, test, start, label FROM master_testrun WHERE test LIKE 'bulk_%%'")
    rng = random.Random(2)
    buf = io.StringIO()
    for run_id, test, start, label in cur.fetchall():
        stamp = start.isoformat()
        for j in range(ENTRIES_BULK):
            wall = rng.uniform(0.95, 1.05) * (j + 1) * 1e-4
            buf.write(f"{run_id}\t{test}\tBM_case_{j}\t{label}\t{stamp}\t{wall}\t{wall}\t1000\t\\N\t{{}}\n")
    buf.seek(0)
    cur.copy_expert(
        "COPY master_testentry (run_id, test, entry, label, start, wall_time_s, cpu_time_s, iterations, throughput,"
        " extras) FROM STDIN",
        buf,
    )
    conn.commit()  # type: ignore[attr-defined]
    conn.autocommit = True  # type: ignore[attr-defined]
    cur.execute("VACUUM ANALYZE master_testentry")
    cur.execute("VACUUM ANALYZE master_testrun")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--entries-per-file", type=int, default=100)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="step 1's upload rate and CPU only: no wait for the detector, no bulk load, no query timing",
    )
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = DEFAULT_PG
    name = f"fleetshard_bench_results_{os.getpid()}"
    url = create_database(name)
    data_dir = Path(tempfile.mkdtemp(prefix="fleetshard-bench-results-"))
    master = None
    try:
        role = Role("master", url, data_dir)
        role.manage("migrate", "--noinput", timeout=300)
        token = role.manage("create_token", "bench", "--admin").stdout.strip().splitlines()[-1]
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = manage_argv("serve", "--bind", f"127.0.0.1:{port}", "--workers", "2")
        master = Service("master", argv, role.env(), data_dir / "master.log")
        master.start()
        wait_until(lambda: _up(base), timeout=90, what="the master to serve")

        before = cpu_seconds(master.proc.pid, name)  # type: ignore[union-attr]
        elapsed, entries = ingest(base, token, args.files, args.entries_per_file, args.threads)
        spent = [b - a for a, b in zip(before, cpu_seconds(master.proc.pid, name), strict=True)]
        print(
            f"ingest: {args.files} files x {args.entries_per_file} entries through the endpoint "
            f"({args.threads} threads, 2 workers): {elapsed:.2f} s, {entries / elapsed:,.0f} entries/s, "
            f"{args.files / elapsed:.1f} files/s",
            flush=True,
        )
        print(
            "CPU per file meanwhile: "
            + ", ".join(f"{who} {s / args.files * 1000:.1f} ms" for who, s in zip(CPU_OF, spent, strict=True))
            + f" ({os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})",
            flush=True,
        )

        if args.ingest_only:
            return
        import psycopg2

        conn = psycopg2.connect(url)
        conn.autocommit = True
        lag, series = detection_lag(conn)
        print(
            f"detection (the master's detector threads, after the requests): {series} series marked by the "
            f"uploads, all read {lag:.1f} s after the last upload",
            flush=True,
        )
        conn.autocommit = False
        started = time.perf_counter()
        bulk_load(conn, args.rows)
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM master_testentry")
        total = cur.fetchone()[0]
        print(f"bulk load: {total:,} entries in the table ({time.perf_counter() - started:.1f} s with COPY)")

        os.environ.update(role.env())
        import django

        django.setup()
        from django.db import connection

        from master.results.queries import timings

        test, entry = "bulk_7", "BM_case_42"
        query = timings(test, entry)[:100]
        sql, params = query.query.sql_with_params()
        times = []
        for _ in range(50):
            started = time.perf_counter()
            rows = list(timings(test, entry)[:100])
            times.append((time.perf_counter() - started) * 1000)
        print(
            f"recent timings of one entry (newest 100 of {_series_length(test, entry):,}, with host and job), "
            f"in-process through the ORM: median {statistics.median(times):.2f} ms, "
            f"p95 {sorted(times)[int(len(times) * 0.95)]:.2f} ms, {len(rows)} rows"
        )
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        http = []
        for _ in range(30):
            started = time.perf_counter()
            resp = session.get(f"{base}/api/v1/results/timings/", params={"test": test, "entry": entry, "limit": 100})
            http.append((time.perf_counter() - started) * 1000)
            resp.raise_for_status()
        print(f"the same through GET /api/v1/results/timings/ (token, count, page): {statistics.median(http):.1f} ms")
        with connection.cursor() as c:
            c.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            print("EXPLAIN (ANALYZE, BUFFERS) of the timings query:")
            for (line,) in c.fetchall():
                print("   ", line)
        connection.close()
        conn.close()
    finally:
        if master is not None:
            master.terminate(20)
        if not args.keep:
            _drop(name)
        else:
            print(f"kept database {url}")


def detection_lag(conn: object, timeout: float = 300) -> tuple[float, int]:
    """Seconds from now (the last upload's answer) until no series is left marked, and how many
    distinct series the uploads marked (each upload marks its own; several to one series are one)."""
    started = time.perf_counter()
    cur = conn.cursor()  # type: ignore[attr-defined]
    cur.execute("SELECT count(DISTINCT (test, entry, label)) FROM master_testentry")
    series = cur.fetchone()[0]
    while time.perf_counter() - started < timeout:
        cur.execute("SELECT count(*) FROM master_dirtyseries")
        if cur.fetchone()[0] == 0:
            return time.perf_counter() - started, series
        time.sleep(0.1)
    raise SystemExit(f"the detector did not drain the marked series within {timeout:.0f} s")


def _series_length(test: str, entry: str) -> int:
    from master.models import TestEntry

    return TestEntry.objects.filter(test=test, entry=entry).count()


def _up(base: str) -> bool:
    try:
        return requests.get(base + "/admin/login/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _drop(name: str) -> None:
    conn = admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


if __name__ == "__main__":
    main()
