"""End to end: a master and two `run_shard` processes run 200 jobs spread over both shards."""

import time

import pytest

from tests.shard.fleet import TIMED, master_hqes, new_shard, overlaps, sql, submit
from tests.support import wait_until

pytestmark = pytest.mark.e2e

JOBS = 200
BODIES = [("true", "Completed", ""), ("false", "Failed", "test"), ("sleep 0.1", "Completed", "")]


def test_two_hundred_jobs_over_two_shards(master_server, tmp_path):
    shards = [new_shard(master_server, tmp_path, hosts=3) for _ in range(2)]
    specs, expected = [], []
    for n in range(JOBS):
        body, status, failure = BODIES[n % len(BODIES)]
        shard = shards[n % 2]
        specs.append({"name": f"e2e-{n}", "command": TIMED.format(body=body), "meta_hosts": [[shard.label, 1]]})
        expected.append((status, failure, set(shard.hosts.values())))
    for shard in shards:
        shard.process.start()
    began = time.monotonic()
    try:
        jobs = submit(master_server, specs)

        def all_done() -> bool:
            rows = master_hqes(master_server, jobs)
            return len(rows) == JOBS and all(r[1] not in ("Queued", "Starting", "Running") for r in rows)

        wait_until(all_done, timeout=240, interval=1, what=f"{JOBS} jobs to end on the master")
        took = time.monotonic() - began
    finally:
        codes = [shard.process.stop() for shard in shards]
    print(f"{JOBS} jobs on 2 shards x 3 hosts: {took:.1f} s from submission to the last end on the master")
    assert codes == [0, 0]
    rows = master_hqes(master_server, jobs)
    for (_, status, failure, _, host_id, _), (want_status, want_failure, hosts) in zip(rows, expected, strict=True):
        assert (status, failure) == (want_status, want_failure)
        assert host_id in hosts
    job_statuses = sql(
        master_server.role.database_url, f"SELECT status FROM common_job WHERE id IN ({','.join(map(str, jobs))})"
    )
    assert sorted(s for (s,) in job_statuses) == sorted(e[0] for e in expected)
    runs, bad = overlaps([s.process.role.data_dir / "results" for s in shards])
    assert (runs, bad) == (JOBS, [])
    for shard in shards:
        per_shard = sum(1 for e in expected if e[2] == set(shard.hosts.values()))
        assert per_shard == JOBS // 2
        active = sql(
            shard.url, "SELECT count(*) FROM common_hostqueueentry WHERE status IN ('Queued','Starting','Running')"
        )
        assert active == [(0,)]
