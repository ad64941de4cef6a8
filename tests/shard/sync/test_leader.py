"""One heartbeat per shard database, with real `run_shard` processes: on PostgreSQL one holds it and another
takes over within an interval when it dies; a worker leaves once idle; SQLite refuses worker mode."""

import os
import re
import signal
import sqlite3
import time
import uuid
from contextlib import closing

import psycopg2
import pytest

from shard.sync.leader import TAKEOVER_S
from tests.shard.fleet import master_hqes, new_shard, sql, submit
from tests.support import free_port, stop, using_postgres, wait_until

pytestmark = pytest.mark.e2e

HOLDS = "this process now runs the shard's heartbeat"


def log_of(shard, name: str) -> str:
    return (shard.process.role.data_dir / f"{name}.log").read_text(errors="replace")


@pytest.mark.postgres_only(reason="several shard processes share a PostgreSQL database only")
def test_one_process_heartbeats_and_another_takes_over_within_an_interval_when_it_dies(
    master_server, tmp_path, started
):
    shard = new_shard(master_server, tmp_path, hosts=1)
    role = shard.process.role
    procs = {}
    for name in ("a", "b"):
        procs[name] = role.start("run_shard", log_name=f"{name}.log")
        started.append((procs[name], role.data_dir / f"{name}.log"))
    holder = wait_until(
        lambda: [n for n in procs if HOLDS in log_of(shard, n)], timeout=60, what="one process to hold the heartbeat"
    )
    time.sleep(2)  # four intervals: the other would have taken it by now
    assert [n for n in procs if HOLDS in log_of(shard, n)] == holder
    other = "b" if holder == ["a"] else "a"
    (job,) = submit(master_server, [{"name": "j", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", what="the job to reach the master")

    os.killpg(procs[holder[0]].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: HOLDS in log_of(shard, other), timeout=10, interval=0.05, what="the other to take over")
    took = time.monotonic() - killed_at
    assert took <= 0.5 + TAKEOVER_S + 1.5, f"took over after {took:.2f} s; the interval is 0.5 s"
    before = sql(shard.url, "SELECT last_heartbeat_ok FROM shard_shardstate")[0][0]
    wait_until(
        lambda: sql(shard.url, "SELECT last_heartbeat_ok FROM shard_shardstate")[0][0] > before,
        what="the new holder's heartbeat to reach the master",
    )
    (job,) = submit(master_server, [{"name": "k", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", what="a job after the takeover")
    assert stop(procs[other]) == 0


@pytest.mark.postgres_only(reason="a worker shares the shard's PostgreSQL database")
def test_a_worker_runs_its_job_then_exits_cleanly_once_idle(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1)
    role = shard.process.role
    (job,) = submit(master_server, [{"name": "j", "command": "sleep 1", "meta_hosts": [[shard.label, 1]]}])
    worker = role.start("run_shard", "--exit-when-idle=2", log_name="worker.log")
    started.append((worker, role.data_dir / "worker.log"))
    assert worker.wait(60) == 0
    log = log_of(shard, "worker")
    assert master_hqes(master_server, [job])[0][1] == "Completed", log
    idle = re.search(r"no run for ([\d.]+) s: exiting", log)
    assert idle and 2 <= float(idle[1]) < 4, log


@pytest.mark.postgres_only(reason="a worker shares the shard's PostgreSQL database")
def test_a_worker_that_never_hears_the_master_still_leaves_once_idle(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1)
    role = shard.process.role
    role.extra_env["FLEETSHARD_MASTER_URL"] = f"http://127.0.0.1:{free_port()}"
    worker = role.start("run_shard", "--exit-when-idle=1", log_name="worker.log")
    started.append((worker, role.data_dir / "worker.log"))
    assert worker.wait(60) == 0
    assert "exiting (--exit-when-idle)" in log_of(shard, "worker")


def test_exit_when_idle_refuses_what_is_not_a_number_of_seconds(tmp_path, master_server):
    shard = new_shard(master_server, tmp_path, hosts=1)
    for seconds in ("0", "-1", "nan", "inf"):
        done = shard.process.role.manage("run_shard", f"--exit-when-idle={seconds}", check=False, timeout=60)
        assert done.returncode == 1
        assert "--exit-when-idle must be a number of seconds above 0" in done.stderr, seconds


def test_sqlite_refuses_worker_mode_in_one_line(tmp_path, master_server):
    if using_postgres():
        pytest.skip("the refusal is SQLite's; this run is on PostgreSQL (the SQLite run checks it)")
    shard = new_shard(master_server, tmp_path, hosts=1)
    for args in (["run_shard", "--exit-when-idle=5"], ["run_worker_manager", "--backend=local", "--max-workers=2"]):
        done = shard.process.role.manage(*args, check=False, timeout=60)
        assert done.returncode == 1
        (line,) = done.stderr.strip().splitlines()
        assert "sqlite database allows one shard process only" in line
        assert "PostgreSQL" in line


def _renew_instance_in(url: str) -> str:
    """What `renew_instance` writes, done from outside the shard's processes."""
    new = str(uuid.uuid4())
    query = "UPDATE shard_shardstate SET instance = %s, last_heartbeat_ok = NULL"
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as conn, conn:
            conn.execute(query.replace("%s", "?"), (new,))
    else:
        with closing(psycopg2.connect(url)) as conn, conn, conn.cursor() as cur:
            cur.execute(query, (new,))
    return new


def test_every_process_of_a_shard_database_stops_once_it_takes_a_new_instance_id(master_server, tmp_path, started):
    """The process the master told that the database went back in time (a backup restored under it)
    renews the instance id and stops; the others, accepted under the old id, must not go on
    scheduling from the restored database either (two processes on PostgreSQL, one on SQLite)."""
    shard = new_shard(master_server, tmp_path, hosts=1)
    role = shard.process.role
    names = ("a", "b") if using_postgres() else ("a",)
    procs = {}
    for name in names:
        procs[name] = role.start("run_shard", log_name=f"{name}.log")
        started.append((procs[name], role.data_dir / f"{name}.log"))
    accepted = "the master accepted this shard database's instance"
    wait_until(lambda: all(accepted in log_of(shard, n) for n in names), timeout=60, what="every process accepted")
    new = _renew_instance_in(shard.url)
    for name in names:
        assert procs[name].wait(30) != 0, log_of(shard, name)
        assert f"stopping: this shard database took the new instance id {new}" in log_of(shard, name)
