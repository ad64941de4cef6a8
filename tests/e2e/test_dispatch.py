"""Dispatch without waiting for the heartbeat: a real `run_shard` at the default 10 s heartbeat interval
starts jobs created at random moments, and the master hears of their ends, through the long-poll and
the nudges. How fast (the 1 s targets) is bench/dispatch.py's to measure."""

import statistics
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests

from tests.shard.fleet import new_shard, sql
from tests.support import assert_status, serve_master, wait_until

pytestmark = pytest.mark.e2e

JOBS = 10
INTERVAL_S = 10.0


@pytest.fixture(scope="module")
def master_10s(tmp_path_factory):
    """A master of its own: the shared one answers with a short interval, which would hide the waits."""
    yield from serve_master(tmp_path_factory, FLEETSHARD_HEARTBEAT_INTERVAL_S=str(int(INTERVAL_S)))


def as_seconds(value) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace(" ", "T"))
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def test_jobs_and_their_ends_travel_by_long_poll_and_nudge_not_the_heartbeat(master_10s, tmp_path):
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
    # The targets (start: median 1 s, worst 2 s; an end seen within 1 s) are measured by
    # bench/dispatch.py, not asserted here: two suites side by side on two cores can miss them. What
    # must hold is that the long-poll and the nudges, not the 10 s heartbeat, carried every job both ways.
    assert len(starts) == len(seen) == JOBS
    assert max(starts) < INTERVAL_S and max(seen) < INTERVAL_S, (starts, seen)


WAITING_SHARDS = 30
# Long enough for one heartbeat and one job creation through the API while the waits are held.
WAIT_S = 8


def test_held_waits_take_no_place_of_heartbeats_and_end_on_their_own_news(master_server):
    """90 waits held by a master with 4 working threads per worker: a heartbeat still answers at once,
    and a job for one shard ends that shard's waits only."""
    tag = uuid.uuid4().hex[:6]
    made = master_server.shell(
        f"""
from master import services
result = []
for n in range({WAITING_SHARDS}):
    label = "wait{tag}:%d" % n
    services.create_labels([label], acting_user=None)
    shard, token = services.create_shard("wait{tag}-%d.lab" % n, [label], acting_user=None)
    services.create_hosts(["wait{tag}-%d-h" % n], acting_user=None, labels=[label])
    result.append([shard.hostname, token, label])
result.append(services.create_personal_token("wait{tag}", admin=True, acting_user=None)[1])
"""
    )
    person = made.pop()
    time.sleep(1.0)  # the shards' own creation is news; let it age
    answers: dict[int, list[tuple[bool | None, float]]] = {n: [] for n in range(WAITING_SHARDS)}

    def wait(n: int) -> None:
        try:
            resp = requests.get(
                master_server.url + "/api/v1/heartbeat/wait",
                params={"timeout": str(WAIT_S)},
                headers={"Authorization": f"Bearer {made[n][1]}"},
                timeout=40,
            )
            answers[n].append((resp.json().get("news") if resp.status_code == 200 else None, time.monotonic()))
        except requests.RequestException:
            answers[n].append((None, time.monotonic()))

    threads = [threading.Thread(target=wait, args=(n,)) for n in range(WAITING_SHARDS) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    assert not any(answers.values()), answers  # all held
    hostname, token, label = made[0]
    began = time.monotonic()
    resp = requests.post(
        master_server.url + "/api/v1/heartbeat",
        json={
            "protocol": 1,
            "shard": hostname,
            "instance": str(uuid.uuid4()),
            "client_version": "t",
            "known_hosts": [],
            "known_jobs": [],
            "updates": [],
        },
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert_status(resp, 200)
    assert len(resp.json()["hosts"]) == 1
    # At once, not once the waits end (WAIT_S after they began, some 6 s from here); room for a loaded machine.
    assert time.monotonic() - began < 4.0
    created = time.monotonic()
    resp = requests.post(
        master_server.url + "/api/v1/jobs/",
        json={"name": "news", "command": "true", "meta_hosts": [made[1][2]]},
        headers={"Authorization": f"Bearer {person}"},
        timeout=10,
    )
    assert_status(resp, 201)
    wait_until(lambda: len(answers[1]) == 3, timeout=20, what="shard 1's waits to end")
    # At once, not at their WAIT_S timeout (with room for a loaded machine).
    assert all(news is True and at - created < 5 for news, at in answers[1])
    assert all(not answers[n] for n in range(2, WAITING_SHARDS))  # the others are still held
    for thread in threads:
        thread.join(30)
    assert all(news is False for n in range(2, WAITING_SHARDS) for news, _ in answers[n])
