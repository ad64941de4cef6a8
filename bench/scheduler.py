"""Scheduler throughput: how fast one scheduler process turns queued `true` jobs into finished HQEs.

Run: `.venv/bin/python bench/scheduler.py [HOSTS:JOBS...]` (default 6:200 30:1000). It uses
DATABASE_URL if set (a throwaway database is expected: it migrates and fills it), else a temporary
SQLite file. Prints, per size: wall time, jobs per second, and the SQL queries and time of one
scheduling pass over the full queue (the tick's cost as the queue grows).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("FLEETSHARD_LOG_LEVEL", "WARNING")
from bench.support import setup_django  # noqa: E402

setup_django("shard")

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from common.models import HostQueueEntry  # noqa: E402
from common.wire import HeartbeatResponse, format_time  # noqa: E402
from shard.config import SchedulerConfig  # noqa: E402
from shard.models import HostState  # noqa: E402
from shard.run.scheduler import Scheduler  # noqa: E402
from shard.sync.ingest import apply_response  # noqa: E402

_next_id = {"host": 1_000_000, "job": 1_000_000}


def fill(hosts: int, jobs: int, label: str) -> None:
    host_wire, job_wire = [], []
    for _ in range(hosts):
        _next_id["host"] += 1
        i = _next_id["host"]
        host_wire.append(
            {"id": i, "version": 1, "hostname": f"bench-{i}", "labels": [label], "locked": False,
             "lock_reason": "", "attributes": {}}
        )  # fmt: skip
    now = format_time(timezone.now())
    for _ in range(jobs):
        _next_id["job"] += 1
        i = _next_id["job"]
        job_wire.append(
            {"id": i, "version": 1, "name": f"bench-{i}", "owner": "bench", "priority": 40, "command": "true",
             "timeout_mins": 1440, "max_runtime_mins": 60, "dependency_labels": [], "keyvals": {},
             "parent_id": None, "aborted": False, "created_on": now,
             "hqes": [{"id": i, "host_id": None, "meta_host": label}]}
        )  # fmt: skip
    apply_response(HeartbeatResponse.parse({"protocol": 1, "hosts": host_wire, "jobs": job_wire}))


def measure(hosts: int, jobs: int, results: Path) -> None:
    label = f"bench:{hosts}x{jobs}"
    fill(hosts, jobs, label)
    config = SchedulerConfig(results_root=results / label.replace(":", "-"), tick_s=0.02, minute_s=60)
    scheduler = Scheduler(config)
    scheduler.recover()
    with CaptureQueriesContext(connection) as pass_queries:
        t0 = time.perf_counter()
        scheduler._schedule()
        pass_s = time.perf_counter() - t0
    began = time.perf_counter()
    while (
        HostQueueEntry.objects.filter(
            job__name__startswith="bench-", status__in=("Queued", "Starting", "Running")
        ).exists()
        or scheduler.busy
    ):
        scheduler.tick()
        time.sleep(config.tick_s)
    took = time.perf_counter() - began
    HostState.objects.filter(host__hostname__startswith="bench-").update(retired=True)
    print(
        f"{hosts:>4} hosts {jobs:>5} jobs: {took:6.1f} s, {jobs / took:6.1f} jobs/s; "
        f"first scheduling pass over {jobs} queued: {len(pass_queries)} queries, {pass_s * 1000:.0f} ms",
        flush=True,
    )


def main() -> None:
    sizes = [tuple(map(int, s.split(":"))) for s in (sys.argv[1:] or ["6:200", "30:1000"])]
    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}")
    with tempfile.TemporaryDirectory(prefix="fleetshard-bench-results-") as tmp:
        for hosts, jobs in sizes:
            measure(hosts, jobs, Path(tmp))


if __name__ == "__main__":
    main()
