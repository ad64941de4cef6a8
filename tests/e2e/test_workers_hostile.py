"""Elastic workers treated roughly, end to end (docs/elastic.md): a worker killed while it registers,
a worker killed mid-run, a worker whose manager dies, and a worker that holds the shard's heartbeat
when it leaves. Real master, real `run_shard` and `run_worker_manager` processes, the shard's own
PostgreSQL database."""

import os
import signal
import subprocess
from pathlib import Path

import psycopg2
import pytest

from tests.e2e.elastic import kill_workers, worker_pids
from tests.shard.fleet import LabShard, master_hqes, new_shard, sql, submit, writable_by_jobs
from tests.support import Master, stop, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="elastic workers share the shard's PostgreSQL database"),
]


def master_hosts(master: Master, shard: LabShard) -> dict[str, str]:
    rows = sql(
        master.role.database_url,
        "SELECT h.hostname, h.status FROM common_host h JOIN common_shard s ON s.id = h.shard_id "
        "WHERE s.hostname = %s ORDER BY h.hostname",
        (shard.process.hostname,),
    )
    return dict(rows)


def execute(url: str, statement: str) -> None:
    pg = psycopg2.connect(url)
    pg.autocommit = True
    try:
        with pg.cursor() as cur:
            cur.execute(statement)
    finally:
        pg.close()


def registrations(shard: LabShard) -> list[tuple[str, int, bool]]:
    return sql(
        shard.process.role.database_url,
        "SELECT worker_id, jsonb_array_length(hosts), released FROM shard_workerregistration ORDER BY worker_id",
    )


def start_worker(shard: LabShard, worker_id: str, *more: str, log_name: str = "") -> subprocess.Popen[bytes]:
    return shard.process.role.start(
        "run_shard",
        "--exit-when-idle=30",
        f"--worker-id={worker_id}",
        "--slots=2",
        f"--label={shard.label}",
        *more,
        log_name=log_name or f"worker-{worker_id}.log",
    )


def worker_hostnames(shard: LabShard, worker_id: str, slots: int = 2) -> dict[str, str]:
    return {f"{shard.process.hostname}-{worker_id}-{k}": "Ready" for k in range(1, slots + 1)}


def test_a_worker_killed_while_it_registers_leaves_nothing_and_its_id_registers_again(master_server, tmp_path):
    """The registration is one transaction: a worker killed inside it (held there by a trigger that
    sleeps after its insert) leaves no row, no host, no generation; its id is then free."""
    shard = new_shard(master_server, tmp_path, hosts=0)
    url = shard.process.role.database_url
    execute(
        url,
        "CREATE FUNCTION slow_registration() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$; "
        "CREATE TRIGGER slow_registration AFTER INSERT ON shard_workerregistration "
        "FOR EACH ROW EXECUTE FUNCTION slow_registration()",
    )
    inserting = (
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
        "AND query LIKE 'INSERT INTO \"shard_workerregistration\"%%'"
    )
    worker = start_worker(shard, "7")
    try:
        wait_until(lambda: sql(url, inserting)[0][0], timeout=60, what="the worker to be inside its registration")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        execute(url, "DROP TRIGGER slow_registration ON shard_workerregistration")
        # Its database session ends once the trigger's sleep does, its transaction never committed.
        wait_until(lambda: not sql(url, inserting)[0][0], timeout=30, what="the killed worker's session to end")
        assert registrations(shard) == []
        assert sql(url, "SELECT generation, worker_hosts FROM shard_discoverystate") in ([], [(0, [])])
        again = start_worker(shard, "7")
        try:
            wait_until(lambda: registrations(shard) == [("7", 2, False)], timeout=60, what="the same id to register")
            wait_until(
                lambda: master_hosts(master_server, shard) == worker_hostnames(shard, "7"),
                timeout=60,
                what="its hosts on the master",
            )
        finally:
            assert stop(again) == 0
        # Alone, the worker held the shard's heartbeat itself: its clean exit still reaches the master.
        wait_until(lambda: master_hosts(master_server, shard) == {}, timeout=30, what="its hosts to leave")
    finally:
        stop(worker)
        kill_workers(shard.process.hostname)


def run_once_command(marks: Path) -> str:
    """Appends a line per start to a file of the HQE's own, then sleeps: a run twice shows two lines."""
    return f'echo "$FLEETSHARD_HOSTNAME" >> {marks}/"$FLEETSHARD_HQE_ID"; sleep 600'


def test_a_worker_killed_mid_run_loses_nothing_runs_nothing_twice_and_leaves_no_process(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=0)
    marks = writable_by_jobs(tmp_path)
    manager = shard.process.role.start(
        "run_worker_manager",
        "--backend=local",
        "--max-workers=1",
        "--slots-per-worker=2",
        "--idle-seconds=5",
        "--tick-seconds=0.5",
        "--min-seconds-between-workers=0.5",
        f"--label={shard.label}",
        log_name="manager.log",
    )
    try:
        wait_until(
            lambda: sql(
                master_server.role.database_url,
                "SELECT pools FROM common_shard WHERE hostname = %s",
                (shard.process.hostname,),
            )[0][0],
            timeout=60,
            what="the pool to be announced",
        )
        jobs = submit(
            master_server,
            [{"name": f"k{n}", "command": run_once_command(marks), "meta_hosts": [[shard.label, 1]]} for n in range(2)],
        )
        wait_until(
            lambda: [r[1] for r in master_hqes(master_server, jobs)] == ["Running"] * 2,
            timeout=60,
            what="both runs",
        )
        (dead,) = worker_pids(shard.process.hostname)
        kill_workers(shard.process.hostname)
        wait_until(
            lambda: [(r[1], r[2]) for r in master_hqes(master_server, jobs)] == [("Failed", "infra")] * 2,
            timeout=30,
            what="the killed worker's runs to end Failed/infra",
        )
        assert master_hosts(master_server, shard) == {
            f"{shard.process.hostname}-{dead}-{k}": "Missing" for k in (1, 2)
        }, "a killed worker's hosts are Missing (docs/discovery.md)"
        # The manager starts a worker for what the dead one left: its recovery kills the runs' processes.
        wait_until(lambda: not jobs_alive(marks), timeout=60, what="the dead worker's runs' processes to be killed")
        # Nothing lost: work queued after the kill runs on a new worker's hosts.
        later = submit(
            master_server,
            [{"name": "after", "command": "true", "meta_hosts": [[shard.label, 1]]}],
        )
        wait_until(
            lambda: [r[1] for r in master_hqes(master_server, later)] == ["Completed"],
            timeout=90,
            what="the job queued after the kill",
        )
        # Nothing run twice: each killed HQE started once, and neither was run again.
        assert sorted(len(p.read_text().splitlines()) for p in marks.iterdir()) == [1, 1]
        assert [(r[1], r[2]) for r in master_hqes(master_server, jobs)] == [("Failed", "infra")] * 2
        assert [r for r in registrations(shard) if r[0] == str(dead)] == []
    finally:
        stop(manager)
        kill_workers(shard.process.hostname)


def jobs_alive(marks: Path) -> list[int]:
    """The pids of processes still running a command of this test (its marks directory in their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(marks).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_worker_whose_manager_dies_finishes_its_run_and_takes_its_hosts_away(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=0)
    manager = shard.process.role.start(
        "run_worker_manager",
        "--backend=local",
        "--max-workers=1",
        "--slots-per-worker=2",
        "--idle-seconds=3",
        "--tick-seconds=0.5",
        f"--label={shard.label}",
        log_name="manager.log",
    )
    try:
        wait_until(
            lambda: sql(
                master_server.role.database_url,
                "SELECT pools FROM common_shard WHERE hostname = %s",
                (shard.process.hostname,),
            )[0][0],
            timeout=60,
            what="the pool to be announced",
        )
        (job,) = submit(master_server, [{"name": "m", "command": "sleep 6", "meta_hosts": [[shard.label, 1]]}])
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Running", timeout=60, what="the run")
        os.killpg(manager.pid, signal.SIGKILL)
        manager.wait()
        # The worker takes over the heartbeat: the run's end reaches the master, and so does its leaving.
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", timeout=60, what="the run's end")
        wait_until(lambda: not worker_pids(shard.process.hostname), timeout=60, what="the worker to exit when idle")
        wait_until(lambda: master_hosts(master_server, shard) == {}, timeout=30, what="its hosts to leave the master")
    finally:
        stop(manager)
        kill_workers(shard.process.hostname)
