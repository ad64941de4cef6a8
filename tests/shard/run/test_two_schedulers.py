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
    for n, (_, status, failure, exit_code, _host, tail) in enumerate(master_hqes(master_server, jobs)):
        # The exit code too: a run killed by a signal (128+N) is Failed/test like `false`, but not the same.
        expected = ("Failed", "test", 1) if n % 4 == 3 else ("Completed", "", 0)
        assert (status, failure, exit_code) == expected, (n, tail)
    runs, bad = overlaps([role.data_dir / "results"])
    assert runs == JOBS
    if bad:
        rows = sql(
            role.database_url,
            "SELECT q.id, q.status, q.failure, q.exit_code, r.runner, r.pid, r.results_dir "
            "FROM common_hostqueueentry q LEFT JOIN shard_run r ON r.hqe_id = q.id "
            f"WHERE q.job_id IN {in_list(jobs)} ORDER BY q.id",
        )
        named = [r for r in rows if r[6] and any(r[6] in b for b in bad)]
        marks = [f"HQE {r[0]} " for r in named] + ["WARNING", "ERROR"]
        logs = {
            p.name: [line for line in p.read_text(errors="replace").splitlines() if any(m in line for m in marks)]
            for p in role.data_dir.glob("scheduler*.log")
        }
        raise AssertionError(f"{bad}\nthose runs' HQEs on the shard: {named}\nscheduler logs: {logs}")
    runners = sql(
        role.database_url,
        "SELECT r.runner, count(*) FROM common_hostqueueentry q JOIN shard_run r ON r.hqe_id = q.id "
        f"WHERE q.job_id IN {in_list(jobs)} GROUP BY r.runner",
    )
    print("HQEs per scheduler process:", runners)
    assert len(runners) == 2, f"both schedulers must have run jobs: {runners}"
