"""Two `run_shard` processes on one PostgreSQL shard database never run two HQEs on one host at once."""

import pytest

from tests.shard.fleet import TIMED, in_list, master_hqes, new_shard, overlaps, sql, submit
from tests.support import stop, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres_only]

JOBS = 90


def test_two_schedulers_share_hosts_without_overlap(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=3, FLEETSHARD_SCHEDULER_TICK_S="0.05")
    body = ["true", "sleep 0.1", "sleep 0.05", "false"]
    jobs = submit(
        master_server,
        [
            {"name": f"j{n}", "command": TIMED.format(body=body[n % 4]), "meta_hosts": [[shard.label, 1]]}
            for n in range(JOBS)
        ],
    )
    role = shard.process.role
    procs = [role.start("run_shard", log_name=f"scheduler{n}.log") for n in (1, 2)]
    try:

        def all_done() -> bool:
            rows = master_hqes(master_server, jobs)
            return len(rows) == JOBS and all(r[1] in ("Completed", "Failed") for r in rows)

        wait_until(all_done, timeout=240, interval=1, what=f"{JOBS} jobs to end on the master")
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0, 0]
    for n, (_, status, failure, *_rest) in enumerate(master_hqes(master_server, jobs)):
        assert (status, failure) == (("Failed", "test") if n % 4 == 3 else ("Completed", "")), n
    runs, bad = overlaps([role.data_dir / "results"])
    assert runs == JOBS
    assert bad == []
    runners = sql(
        role.database_url,
        f"SELECT runner, count(*) FROM common_hostqueueentry WHERE job_id IN {in_list(jobs)} GROUP BY runner",
    )
    print("HQEs per scheduler process:", runners)
    assert len(runners) == 2, f"both schedulers must have run jobs: {runners}"
