"""Heartbeat cost at growing fleet sizes: wall time, SQL queries and peak Python memory per heartbeat.

Run: `.venv/bin/python bench/heartbeat.py [SIZES...]` (default 10 100 1000). It uses DATABASE_URL if set
(a throwaway database is expected: it migrates and fills it), else a temporary SQLite file.
"""

import json
import os
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.support import setup_django  # noqa: E402

setup_django("master")

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from common.models import HostQueueEntry  # noqa: E402
from master import services  # noqa: E402

ROUNDS = 5


def measure(n: int) -> dict[str, float]:
    label = f"bench:{n}"
    services.create_labels([label], acting_user=None)
    shard, token = services.create_shard(f"bench{n}", [label], acting_user=None)
    services.create_hosts([f"b{n}-{i}" for i in range(n)], labels=[label], acting_user=None)
    jobs = [
        services.create_job(
            services.JobRequest(name=f"b{i}", owner="bench", command="true", meta_hosts=[(label, 1)]), acting_user=None
        )
        for i in range(n)
    ]
    hqes = list(HostQueueEntry.objects.filter(job__in=jobs).values_list("id", "job_id"))
    client = Client(HTTP_HOST="127.0.0.1")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def post(body: dict) -> dict:
        resp = client.post("/api/v1/heartbeat", json.dumps(body), content_type="application/json", **headers)
        assert resp.status_code == 200, resp.content
        return resp.json()

    base = {"protocol": 1, "shard": shard.hostname, "instance": str(uuid.uuid4()), "client_version": "bench"}
    first = post({**base, "known_hosts": [], "known_jobs": [], "updates": []})
    known_hosts = [{"id": h["id"], "version": h["version"], "status": "Ready"} for h in first["hosts"]]
    known_jobs = [{"id": j["id"], "version": j["version"]} for j in first["jobs"]]
    times, queries, peaks, seq = [], [], [], 0
    for r in range(ROUNDS):
        status = "Running" if r % 2 == 0 else "Starting"
        updates = []
        for hqe_id, job_id in hqes[:1000]:
            seq += 1
            updates.append(
                {"seq": seq, "hqe": hqe_id, "job": job_id, "status": status if r < ROUNDS - 1 else "Completed"}
            )
        body = {**base, "known_hosts": known_hosts, "known_jobs": known_jobs, "updates": updates}
        # Timed alone: tracemalloc and query capture both slow Python down.
        start = time.perf_counter()
        post(body)
        times.append(time.perf_counter() - start)
        body["updates"] = [{**u, "seq": u["seq"] + 10**6 * (r + 1)} for u in updates]
        tracemalloc.start()
        with CaptureQueriesContext(connection) as ctx:
            post(body)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        queries.append(len(ctx.captured_queries))
        if os.environ.get("BENCH_SHOW_QUERIES"):
            for q in sorted(ctx.captured_queries, key=lambda q: -float(q["time"]))[:5]:
                print(q["time"], q["sql"][:150])
    times.sort()
    return {"ms": times[len(times) // 2] * 1000, "queries": max(queries), "peak_mib": max(peaks) / 2**20}


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [10, 100, 1000]
    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}; {ROUNDS} heartbeats per size, each carrying every host, job and update")
    print(f"{'hosts=jobs=updates':>20} {'median ms':>10} {'queries':>8} {'peak MiB':>9}")
    for n in sizes:
        m = measure(n)
        print(f"{n:>20} {m['ms']:>10.1f} {m['queries']:>8} {m['peak_mib']:>9.1f}")


if __name__ == "__main__":
    main()
