"""The master's staff pages at fleet size: the fleet overview and every admin changelist, timed.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/pages.py [--shards 500 --hosts 200]

Sets up a throwaway PostgreSQL database with --shards shards of --hosts hosts (bulk rows as the services
would leave them: hosts in every status, some locked; shards online, late and never seen; --jobs jobs a
shard in every status with their HQEs, some failed in the last day), then fetches each page --rounds
times through Django's test client, logged in as a superuser, and prints the median and p95 time and
the response's size. The page's queries are counted on the last round. Nothing here asserts a time:
the figures go into docs/benchmarks.md.
"""

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import DEFAULT_PG, admin_connection, create_database, fill_fleet_rows, say  # noqa: E402

# The pages timed: the overview, its later pages and its search, and every changelist the master's
# admin registers (master/admin), plain and with the filters an operator uses most.
PAGES = [
    "/admin/fleet/",
    "/admin/fleet/?page=5",
    "/admin/fleet/?sort=name&page=10",
    "/admin/fleet/?q=fleet42",
    "/admin/common/host/",
    "/admin/common/host/?status__exact=Repair+Failed",
    "/admin/common/host/?q=fleet7-dut1",
    "/admin/common/host/?p=500",
    "/admin/common/host/?o=2",
    "/admin/common/shard/",
    "/admin/common/shard/?state=offline",
    "/admin/common/shard/?o=6",
    "/admin/common/job/",
    "/admin/common/job/?status__exact=Failed",
    "/admin/common/job/?q=fleet9-job1",
    "/admin/common/label/",
    "/admin/master/token/",
    "/admin/auth/user/",
    "/admin/auth/group/",
    "/admin/master/testrun/",
    "/admin/master/regression/",
    "/admin/master/rejectedresult/",
    "/admin/master/subscription/",
    "/admin/master/auditrecord/",
]


def fill(n_shards: int, n_hosts: int, n_jobs: int) -> None:
    """Bulk rows: hosts and jobs by INSERT ... SELECT, shards and their tokens by the service (500 calls)."""
    from django.db import transaction
    from django.utils import timezone

    from common.models import Label, Shard
    from master import services

    now = timezone.now()
    for s in range(n_shards):
        with transaction.atomic():
            label = Label.objects.create(name=f"board:fleet{s}")
            services.create_shard(f"fleet{s}.lab", [label.name], acting_user=None)
    # Most shards heartbeat now; one in 25 is late (two minutes ago), one in 50 never heard from.
    Shard.objects.update(last_heartbeat=now, client_version="0.1.0")
    for shard in Shard.objects.all():
        n = int(shard.hostname[5:].split(".")[0])
        if n % 50 == 7:
            Shard.objects.filter(pk=shard.pk).update(last_heartbeat=None, client_version="")
        elif n % 25 == 3:
            Shard.objects.filter(pk=shard.pk).update(last_heartbeat=now - timedelta(minutes=2))
    statuses = (
        "ARRAY['Ready','Ready','Ready','Ready','Running','Running','Cleaning','Repairing','Repair Failed','Missing']"
    )
    job_statuses = "ARRAY['Queued','Queued','Running','Completed','Completed','Completed','Failed','Aborted']"
    fill_fleet_rows(
        n_hosts,
        n_jobs,
        hosts={"locked": "mod(g, 40) = 0", "status": f"({statuses})[1 + mod(g + s.id, 10)]"},
        jobs={
            "status": f"({job_statuses})[1 + mod(g + s.id, 8)]",
            "created_on": "now() - g * interval '1 minute'",
        },
        hqes={
            "status": "j.status",
            "finished_on": "CASE WHEN j.status IN ('Completed', 'Failed', 'Aborted') THEN j.created_on END",
        },
    )


def measure(client: Any, path: str, rounds: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(path)  # warm: templates, content types, the session
    times = []
    size = 0
    status = 0
    for _ in range(rounds):
        with CaptureQueriesContext(connection) as queries:
            began = time.perf_counter()
            resp = client.get(path)
            body = resp.content
            times.append((time.perf_counter() - began) * 1000)
        size, status = len(body), resp.status_code
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return {
        "path": path,
        "status": status,
        "p50_ms": statistics.median(times),
        "p95_ms": p95,
        "kib": size / 1024,
        "queries": len(queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=500)
    parser.add_argument("--hosts", type=int, default=200, help="hosts a shard")
    parser.add_argument("--jobs", type=int, default=50, help="jobs a shard")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", default="", help="time only the pages whose path contains this")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    args = parser.parse_args()

    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = DEFAULT_PG
    dbname = f"pages_bench_{uuid.uuid4().hex[:8]}"
    os.environ["DATABASE_URL"] = create_database(dbname)
    os.environ["FLEETSHARD_ROLE"] = "master"
    os.environ.setdefault("FLEETSHARD_DATA_DIR", str(Path(f"/tmp/fleetshard-pages-{dbname}")))
    os.environ["DJANGO_SETTINGS_MODULE"] = "server.settings"
    os.environ.setdefault("SECRET_KEY", "pages-bench")
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    try:
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        call_command("migrate", verbosity=0, interactive=False)
        began = time.monotonic()
        fill(args.shards, args.hosts, args.jobs)
        say(
            f"filled {args.shards} shards x {args.hosts} hosts ({args.shards * args.hosts:,}),"
            f" {args.jobs} jobs a shard, in {time.monotonic() - began:.1f} s (database {dbname})"
        )
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", "pw"))
        load = os.getloadavg()
        say(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        say(f"| page | status | p50 ms | p95 ms | KiB | queries |  ({args.rounds} rounds each)")
        for path in PAGES:
            if args.only and args.only not in path:
                continue
            f = measure(client, path, args.rounds)
            say(
                f"| `{path}` | {f['status']} | {f['p50_ms']:.0f} | {f['p95_ms']:.0f} | {f['kib']:.0f} |"
                f" {f['queries']} |"
            )
        load = os.getloadavg()
        say(f"load average after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            conn = admin_connection()
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.close()


if __name__ == "__main__":
    main()
