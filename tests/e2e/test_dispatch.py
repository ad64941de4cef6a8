"""Dispatch in under a second: a real `run_shard` at the default 10 s heartbeat interval starts jobs
created at random moments within a second, and the master hears of their ends within a second."""

import statistics
import threading
import time
from datetime import UTC, datetime

import pytest

from tests.shard.fleet import new_shard, sql
from tests.support import serve_master, wait_until

pytestmark = pytest.mark.e2e

JOBS = 10


@pytest.fixture(scope="module")
def master_10s(tmp_path_factory):
    """A master of its own: the shared one answers with a short interval, which would hide the waits."""
    yield from serve_master(tmp_path_factory, FLEETSHARD_HEARTBEAT_INTERVAL_S="10")


def as_seconds(value) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace(" ", "T"))
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def test_jobs_start_within_a_second_of_creation_and_their_ends_reach_the_master_within_a_second(master_10s, tmp_path):
    shard = new_shard(master_10s, tmp_path, hosts=JOBS, FLEETSHARD_SCHEDULER_TICK_S="1")
    url = master_10s.role.database_url
    shard.process.start()
    seen_done: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:
        """When the master first shows each HQE ended, by polling its database from outside."""
        while not stop.is_set():
            for (hqe_id,) in sql(url, "SELECT id FROM common_hostqueueentry WHERE status = 'Completed'"):
                seen_done.setdefault(hqe_id, time.time())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    try:
        wait_until(
            lambda: sql(url, "SELECT last_heartbeat FROM common_shard WHERE hostname = %s", (shard.process.hostname,))[
                0
            ][0],
            timeout=30,
            what="the shard's first heartbeat",
        )
        time.sleep(1.0)  # the shard is between heartbeats, long-polling
        watcher.start()
        # One process creates the jobs at random moments, as people would.
        master_10s.shell(
            f"""
import random, time
from master import services
random.seed(13)
result = []
for n in range({JOBS}):
    time.sleep(random.uniform(0.2, 1.2))
    job = services.create_job(services.JobRequest(name=f"dispatch-{{n}}", owner="ana", command="sleep 0.3",
        meta_hosts=[("{shard.label}", 1)]), acting_user=None)
    result.append(job.id)
"""
        )

        def all_done() -> bool:
            rows = sql(url, "SELECT count(*) FROM common_hostqueueentry WHERE status = 'Completed'")
            return rows[0][0] == JOBS and len(seen_done) == JOBS

        wait_until(all_done, timeout=30, interval=0.2, what=f"{JOBS} jobs completed on the master")
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(5)
        code = shard.process.stop()
    assert code == 0
    rows = sql(
        url,
        "SELECT h.id, j.created_on, h.started_on, h.finished_on FROM common_hostqueueentry h "
        "JOIN common_job j ON j.id = h.job_id ORDER BY h.id",
    )
    starts = [as_seconds(started) - as_seconds(created) for _, created, started, _ in rows]
    seen = [seen_done[hqe_id] - as_seconds(finished) for hqe_id, _, _, finished in rows]
    print(
        f"dispatch: start after creation median {statistics.median(starts):.2f} s, max {max(starts):.2f} s; "
        f"end seen by the master median {statistics.median(seen):.2f} s, max {max(seen):.2f} s"
    )
    # The targets (start: median 1 s, worst 2 s; an end seen within 1 s, here at the median,
    # with the worst allowed 2 s on a machine shared with other test runs).
    assert statistics.median(starts) < 1.0
    assert max(starts) < 2.0
    assert statistics.median(seen) < 1.0
    assert max(seen) < 2.0
