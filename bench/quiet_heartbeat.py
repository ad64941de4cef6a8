"""What one quiet heartbeat costs the application, without an HTTP server: the master's CPU and its
PostgreSQL backend's, per heartbeat, at a fleet's size.

Run: `.venv/bin/python bench/quiet_heartbeat.py [--shards 100] [--synced 200] [--heartbeats 3000]` with
DATABASE_URL naming a PostgreSQL server (default postgres://postgres@127.0.0.1:5432/postgres). It creates a
throwaway database, fills it as `bench/fleet.py` does, cold-syncs --synced shards picked at random, then
sends quiet heartbeats of those shards, picked at random, through Django's WSGI handler in this one
thread (the token cache on, as `serve` has it). It prints the holdings statement's plan with its buffers,
then each round's CPU per heartbeat. Set against `bench/fleet.py`'s capacity at the same size, the
difference is what the HTTP server costs (docs/benchmarks.md, "Where a quiet heartbeat's time goes").
The database is dropped at the end.
"""

import argparse
import io
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import DEFAULT_PG, admin_connection, cpu_seconds, create_database, say  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--synced", type=int, default=200, help="shards whose heartbeats are sent")
    parser.add_argument("--heartbeats", type=int, default=3000, help="heartbeats a round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = DEFAULT_PG
    dbname = f"quiet_bench_{uuid.uuid4().hex[:8]}"
    os.environ.update(
        DATABASE_URL=create_database(dbname),
        FLEETSHARD_ROLE="master",
        DJANGO_SETTINGS_MODULE="server.settings",
        FLEETSHARD_DETECT_IN_SERVE="0",
        SECRET_KEY="quiet-bench",
    )
    os.environ.setdefault("FLEETSHARD_DATA_DIR", str(Path("/tmp") / dbname))
    try:
        run(args)
    finally:
        from django.db import connections

        from master.sync.notifier import stop_listener

        stop_listener()
        connections.close_all()
        conn = admin_connection()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.close()


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.management import call_command
    from django.db import connection

    from bench.fleet import SimShard, fill
    from common.constants import JobStatus
    from master.access.token_cache import CACHE
    from master.sync.heartbeat import _Statements
    from master.sync.notifier import start_listener

    call_command("migrate", verbosity=0)
    began = time.monotonic()
    sims = fill(args.shards, args.hosts, args.jobs)
    say(f"filled {args.shards} shards x {args.hosts} hosts x {args.jobs} jobs in {time.monotonic() - began:.1f} s")
    start_listener()  # the token cache is trusted only while this process hears every change
    for _ in range(100):
        if CACHE.generation() is not None:
            break
        time.sleep(0.05)
    app = WSGIHandler()

    def post(sim: SimShard) -> bytes:
        body = sim.body()
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/api/v1/heartbeat",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "HTTP_HOST": "127.0.0.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "HTTP_AUTHORIZATION": f"Bearer {sim.token}",
        }
        status: list[str] = []
        data = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        if not status[0].startswith("200"):
            raise RuntimeError(f"heartbeat {status[0]}: {data[:300]!r}")
        return data

    rng = random.Random(1)
    synced = rng.sample(sims, min(args.synced, len(sims)))
    for sim in synced:
        while sim.ingest(post(sim)):
            pass
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM common_shard WHERE hostname = %s", [synced[0].hostname])
        shard_id = cursor.fetchone()[0]
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + _Statements.of(connection.vendor).holdings,
            [shard_id, shard_id, *JobStatus.ACTIVE],
        )
        say("the holdings' plan, one shard:\n  " + "\n  ".join(row[0] for row in cursor.fetchall()))
    dbname = connection.settings_dict["NAME"]

    for sim in synced:  # warm: every token in the cache, every statement prepared
        post(sim)
    for _ in range(args.rounds):
        wall, (_, pg, cpu) = time.perf_counter(), cpu_seconds(0, dbname)
        for _ in range(args.heartbeats):
            post(synced[rng.randrange(len(synced))])
        n = args.heartbeats
        say(
            f"{args.shards * args.hosts:,} hosts, {len(synced)} shards heartbeating: a quiet heartbeat "
            f"{(time.perf_counter() - wall) / n * 1e3:.3f} ms wall, "
            f"master CPU {(cpu_seconds(0, dbname)[2] - cpu) / n * 1e3:.3f} ms, "
            f"PostgreSQL {(cpu_seconds(0, dbname)[1] - pg) / n * 1e3:.3f} ms (load {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
