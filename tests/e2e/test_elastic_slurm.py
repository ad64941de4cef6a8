"""Elastic workers end to end as real Slurm batch jobs (a single-node Slurm on loopback, tests/e2e/slurm.py):
workers seen in `squeue`, every job completed, never more workers than the maximum, even across a
manager killed and restarted mid-way, and no worker left afterwards."""

import os
import re
import signal
import threading

import pytest

from shard.elastic.manager import pool_key
from tests.e2e.elastic import JOBS, MAX_WORKERS, all_ended, elastic_shard, manager_args, submit_jobs
from tests.e2e.slurm import slurm  # noqa: F401 (the fixture)
from tests.shard.fleet import master_hqes
from tests.support import stop, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="elastic workers share the shard's PostgreSQL database"),
]


@pytest.mark.xdist_group("slurm")  # one single-node Slurm per run (test_elastic_slots.py uses it too)
def test_slurm_workers_run_every_job_and_a_restarted_manager_finds_them(master_server, tmp_path, slurm):  # noqa: F811
    shard = elastic_shard(master_server, tmp_path)
    role = shard.process.role
    role.extra_env.update(slurm.env)
    name = pool_key(shard.process.hostname, [shard.label])
    args = manager_args(shard, "slurm", "--slurm-partition=debug", "--slurm-time-limit=10")
    most = [0]
    seen: set[str] = set()
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            jobs = slurm.jobs(name)
            most[0] = max(most[0], len(jobs))
            seen.update(job_id for job_id, _ in jobs)
            watching.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    manager = role.start(*args, log_name="manager.log")
    restarted = None
    try:
        jobs = submit_jobs(master_server, shard, command="sleep 1")
        wait_until(lambda: len(slurm.jobs(name)) >= 2, timeout=60, what="Slurm to run workers")
        os.killpg(manager.pid, signal.SIGKILL)
        manager.wait(10)
        restarted = role.start(*args, log_name="manager-restarted.log")
        wait_until(lambda: all_ended(master_server, shard, jobs), timeout=120, interval=0.3, what="every job")
        wait_until(lambda: not slurm.jobs(name), timeout=30, what="the workers to leave Slurm's queue")
    finally:
        watching.set()
        watcher.join()
        if restarted is not None:
            stop(restarted)
        stop(manager)
    assert [row[1] for row in master_hqes(master_server, jobs)] == ["Completed"] * JOBS
    assert 1 <= most[0] <= MAX_WORKERS, f"{most[0]} Slurm jobs at once"
    log = (role.data_dir / "manager-restarted.log").read_text()
    found = re.search(r"found (\d+) slurm workers of the pool", log)
    assert found and int(found[1]) >= 2, log
    assert len(seen) >= MAX_WORKERS, seen
