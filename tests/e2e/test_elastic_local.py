"""Elastic workers end to end with the `local` backend: a real master, the worker manager heartbeating
for the shard, and `run_shard --exit-when-idle` workers it starts and that leave once idle."""

import os
import signal
import time

import pytest

from tests.e2e.elastic import (
    IDLE_S,
    JOBS,
    MAX_WORKERS,
    TICK_S,
    WorkerWatch,
    all_ended,
    elastic_shard,
    kill_workers,
    manager_args,
    submit_jobs,
    worker_pids,
)
from tests.shard.fleet import in_list, master_hqes, sql, submit
from tests.support import stop, wait_until

RESULT = 'echo "{}" > "$FLEETSHARD_RESULTS_DIR/results/r.json"'  # results/ is made for the job

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="elastic workers share the shard's PostgreSQL database"),
]


def test_local_workers_run_every_job_never_above_max_and_leave_once_idle(master_server, tmp_path):
    shard = elastic_shard(master_server, tmp_path)
    role = shard.process.role
    manager = role.start(*manager_args(shard, "local"), log_name="manager.log")
    try:
        with WorkerWatch(shard.process.hostname) as watch:
            wait_until(
                lambda: role.data_dir.joinpath("manager.log").read_text().count("runs the shard's heartbeat"),
                what="the manager to hold the shard's heartbeat",
            )
            assert not watch.seen, "no work, no worker"
            jobs = submit_jobs(master_server, shard, command=f"sleep 1; {RESULT}")
            wait_until(lambda: all_ended(master_server, shard, jobs), timeout=90, interval=0.2, what="every job")
            done_at = time.monotonic()
            wait_until(
                lambda: not worker_pids(shard.process.hostname), timeout=IDLE_S + TICK_S + 30, what="workers to exit"
            )
            time.sleep(0.2)
        statuses = [row[1] for row in master_hqes(master_server, jobs)]
        assert statuses == ["Completed"] * JOBS
        assert 1 <= watch.most <= MAX_WORKERS, f"{watch.most} workers at once"
        gone_after = watch.last_seen_at - done_at
        # IDLE_S and a tick, with room for a loaded machine's late ticks and exits (not twice IDLE_S).
        assert gone_after <= IDLE_S + TICK_S + 4, f"the last worker left {gone_after:.1f} s after the work ended"
        log = role.data_dir.joinpath("manager.log").read_text()
        assert "started local worker" in log
        # Each worker's uploader sent its runs' result files (this one the master quarantines).
        handled = sorted(p.parent.name for p in (role.data_dir / "results").glob("*/*/*/r.json"))
        assert handled == ["quarantine"] * JOBS, handled
        assert manager.poll() is None, log
    finally:
        code = stop(manager)
        kill_workers(shard.process.hostname)
    assert code == 0


def test_a_second_manager_of_the_same_pool_waits_until_the_first_is_gone(master_server, tmp_path):
    shard = elastic_shard(master_server, tmp_path)
    role = shard.process.role
    managers = [role.start(*manager_args(shard, "local"), log_name=f"manager{n}.log") for n in (1, 2)]

    def tickers() -> list[int]:
        return [n for n in (1, 2) if "runs worker pool" in (role.data_dir / f"manager{n}.log").read_text()]

    try:
        (first,) = wait_until(tickers, timeout=60, what="one manager to run the pool")
        time.sleep(2)
        assert tickers() == [first], "two managers ran the pool at once"
        once = role.manage(*manager_args(shard, "local"), "--once", check=False, timeout=60)
        assert once.returncode == 1 and "another worker manager runs pool" in once.stderr, once.stderr
        os.killpg(managers[first - 1].pid, signal.SIGKILL)
        wait_until(lambda: len(tickers()) == 2, timeout=10, what="the standby to take the pool over")
    finally:
        codes = [stop(m) for m in managers]
    assert codes[2 - first] == 0


INTERVAL_S = 20.0


@pytest.mark.parametrize("own_master", [{"FLEETSHARD_HEARTBEAT_INTERVAL_S": f"{INTERVAL_S:g}"}], indirect=True)
def test_a_workers_run_end_reaches_the_master_well_within_the_heartbeat_interval(own_master, tmp_path):
    """Workers do not hold the heartbeat (the manager does): a run's end they write to the outbox
    NOTIFYs the holder, which heartbeats at once instead of at its next 20 s interval."""
    shard = elastic_shard(own_master, tmp_path)
    role = shard.process.role
    manager = role.start(*manager_args(shard, "local"), log_name="manager.log")
    try:
        wait_until(
            lambda: role.data_dir.joinpath("manager.log").read_text().count("runs the shard's heartbeat"),
            what="the manager to hold the shard's heartbeat",
        )
        jobs = submit(
            own_master, [{"name": f"p{n}", "command": "sleep 1", "meta_hosts": [[shard.label, 1]]} for n in range(3)]
        )
        seen: dict[int, float] = {}
        deadline = time.monotonic() + 90
        while len(seen) < len(jobs) and time.monotonic() < deadline:
            for hqe, status, finished_on in sql(
                own_master.role.database_url,
                f"SELECT id, status, finished_on FROM common_hostqueueentry WHERE job_id IN {in_list(jobs)}",
            ):
                if status == "Completed" and hqe not in seen:
                    seen[hqe] = time.time() - finished_on.timestamp()
            time.sleep(0.1)
        assert len(seen) == len(jobs), seen
        # Well within the 20 s interval, with room for a loaded machine.
        assert max(seen.values()) < INTERVAL_S / 2, (
            f"run ends reached the master {sorted(seen.values())} s after they ended"
        )
        workers = {row[0].split(":")[1] for row in sql(shard.url, "SELECT runner FROM shard_run")}
        assert str(manager.pid) not in workers, "the manager ran a job: no worker's end was measured"
    finally:
        stop(manager)
        kill_workers(shard.process.hostname)
