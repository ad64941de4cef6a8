"""`run_shard` as a real process, facing untrusted jobs and a failing world: NUL output, a job hunting for
the shard's secrets, a crash with a daemon left behind, a database that fails every query, a master
that has not (or will not) accept the shard's instance."""

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import psycopg2
import pytest

from tests.shard.fleet import new_shard, sql, submit
from tests.shard.run.test_trust_boundary import processes_running, unique_sleep
from tests.shard.test_run_shard import alive, log_of, master_status, shard_hqe, start
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another user only when the shard is root")


def test_nul_and_undecodable_output_end_as_replacement_characters_and_the_next_job_runs(
    master_server, tmp_path, started
):
    shard = new_shard(master_server, tmp_path, hosts=1)
    dirty, after = submit(
        master_server,
        [
            {
                "name": "dirty",
                "command": r"printf 'a\000b\355\240\200c\n'",
                "meta_hosts": [[shard.label, 1]],
                "priority": 70,
            },
            {"name": "after", "command": "echo next", "meta_hosts": [[shard.label, 1]]},
        ],
    )
    start(shard, started)
    wait_until(lambda: master_status(master_server, after)[1] == "Completed", timeout=60, what="the next job")
    _, status, _, _, _, tail = master_status(master_server, dirty)
    assert status == "Completed"
    assert "a\ufffdb" in tail and "\x00" not in tail
    (shard_tail,) = sql(shard.url, f"SELECT log_tail FROM common_hostqueueentry WHERE job_id = {dirty}")[0]
    assert "a\ufffdb" in shard_tail


@as_root
def test_a_job_finds_none_of_the_shards_secrets(master_server, tmp_path, started):
    secrets = {"PGPASSWORD": "pg-secret-8c1f", "AWS_SECRET_ACCESS_KEY": "aws-secret-77d2", "SECRET_KEY": "dj-9f3e"}
    shard = new_shard(master_server, tmp_path, hosts=1, **secrets)
    data_dir = shard.process.role.data_dir
    token = shard.process.role.extra_env["FLEETSHARD_SHARD_TOKEN"]
    token_file = data_dir / "shard.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    shard.process.role.extra_env.update(FLEETSHARD_SHARD_TOKEN="", FLEETSHARD_SHARD_TOKEN_FILE=str(token_file))
    databases = " ".join(str(p) for p in data_dir.glob("*.sqlite3"))
    command = (
        "echo uid=$(id -u); tr '\\0' '\\n' < /proc/$PPID/environ; "
        f"cat {token_file}; ls -la {data_dir}; "
        f"for db in {databases}; do head -c 4096 $db | tr -cd '[:print:]\\n'; done; "
        f"ls {data_dir}/results; env"
    )
    (job,) = submit(master_server, [{"name": "snoop", "command": command, "meta_hosts": [[shard.label, 1]]}])
    start(shard, started)
    wait_until(lambda: master_status(master_server, job)[1] in ("Completed", "Failed"), timeout=60, what="the job")
    _, _, _, _, _, tail = master_status(master_server, job)
    log = Path(shard_hqe(shard, job)[2], "job.log").read_text(errors="replace")
    assert "uid=65534" in log.splitlines()
    for text in (log, tail):
        for secret in [token, *secrets.values(), "e2e-test-secret"]:
            assert secret not in text
        assert "DATABASE_URL" not in text and "Permission denied" in text
    assert "jobs run as user nobody" in log_of(shard)


def test_a_token_file_that_others_can_read_is_refused(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    token_file = tmp_path / "shard.token"
    token_file.write_text("whatever\n")
    token_file.chmod(0o644)
    shard.process.role.extra_env.update(FLEETSHARD_SHARD_TOKEN="", FLEETSHARD_SHARD_TOKEN_FILE=str(token_file))
    proc = shard.process.role.manage("run_shard", check=False, timeout=60)
    assert proc.returncode != 0
    assert f"FLEETSHARD_SHARD_TOKEN_FILE={token_file} is readable by group or others" in proc.stderr


def test_a_crashed_shards_setsid_daemon_is_killed_when_it_restarts(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1)
    daemon = unique_sleep()
    (job,) = submit(
        master_server, [{"name": "daemon", "command": f"setsid {daemon} & sleep 300", "meta_hosts": [[shard.label, 1]]}]
    )
    first = start(shard, started, "first")
    wait_until(lambda: processes_running(daemon), timeout=60, what="the daemon")
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert processes_running(daemon), "the daemon outlives its shard process, so the restart must deal with it"
    start(shard, started, "second")
    wait_until(lambda: master_status(master_server, job)[1] == "Failed", timeout=60, what="the infra failure")
    assert master_status(master_server, job)[2] == "infra"
    assert processes_running(daemon) == []


def break_database(url: str) -> None:
    """From now on every query of the shard fails: a SQLite file overwritten, a PostgreSQL database closed."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        for extra in ("-wal", "-shm"):
            path.with_name(path.name + extra).unlink(missing_ok=True)
        path.write_bytes(b"not a database " * 1000)
        return
    name = url.rsplit("/", 1)[1]
    conn = psycopg2.connect(url.rsplit("/", 1)[0] + "/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    conn.close()


def test_sigterm_stops_the_shard_even_when_every_query_fails(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_DRAIN_S="2", FLEETSHARD_ABORT_GRACE_S="2")
    daemon = unique_sleep()
    (job,) = submit(
        master_server, [{"name": "long", "command": f"setsid {daemon} & sleep 300", "meta_hosts": [[shard.label, 1]]}]
    )
    proc = start(shard, started)
    wait_until(lambda: processes_running(daemon), timeout=60, what="the job")
    pid = shard_hqe(shard, job)[3]
    break_database(shard.url)
    time.sleep(2)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    print(f"stopped {time.monotonic() - began:.1f} s after SIGTERM")
    assert not alive(pid) and processes_running(daemon) == []


def test_sigint_stops_at_once_even_when_every_query_fails(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_DRAIN_S="600", FLEETSHARD_ABORT_GRACE_S="600")
    daemon = unique_sleep()
    (job,) = submit(
        master_server, [{"name": "long", "command": f"setsid {daemon} & sleep 300", "meta_hosts": [[shard.label, 1]]}]
    )
    proc = start(shard, started)
    wait_until(lambda: processes_running(daemon), timeout=60, what="the job")
    break_database(shard.url)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    assert processes_running(daemon) == []


# The instance gate: nothing is touched before the master accepts this shard's instance.

SEED = """
from common.wire import HeartbeatResponse
from shard.sync.ingest import apply_response
from shard.services import open_run, transition_hqe
from shard.locks import shard_write
host = {"id": 9001, "version": 1, "hostname": "gate-dut", "labels": ["board:gate"], "locked": False,
        "lock_reason": "", "attributes": {}}
def job(job_id, hqe_id):
    return {"id": job_id, "version": 1, "name": f"j{job_id}", "owner": "ana", "priority": 40,
            "command": "true", "timeout_mins": 1440, "max_runtime_mins": 60, "dependency_labels": [],
            "keyvals": {}, "parent_id": None, "aborted": False, "created_on": None,
            "hqes": [{"id": hqe_id, "host_id": None, "meta_host": "board:gate"}]}
apply_response(HeartbeatResponse.parse({"protocol": 1, "hosts": [host], "jobs": [job(9001, 9001), job(9002, 9002)]}))
# An HQE a dead shard process on this machine left Running: crash recovery would close it.
import socket
with shard_write():
    transition_hqe(9002, "Running", host_id=9001)
    open_run(9002, f"{socket.gethostname()}:999999999:0")
result = 1
"""


def gate_statuses(shard) -> list[tuple]:
    return sql(shard.url, "SELECT id, status FROM common_hostqueueentry WHERE id IN (9001, 9002) ORDER BY id")


def test_nothing_is_touched_before_the_master_accepts_the_instance(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=0, FLEETSHARD_MASTER_URL=f"http://127.0.0.1:{free_port()}")
    shard.process.shell(SEED)
    proc = start(shard, started)
    wait_until(lambda: "waiting for the master to accept" in log_of(shard), timeout=60, what="the shard to wait")
    time.sleep(3)
    assert gate_statuses(shard) == [(9001, "Queued"), (9002, "Running")]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert gate_statuses(shard) == [(9001, "Queued"), (9002, "Running")]


class RefusingMaster(BaseHTTPRequestHandler):
    """A master that hears another live instance of this shard."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(
            {"error": "shard gate-lab: another instance was heard 2 s ago", "detail": {"field": "instance"}}
        ).encode()
        self.send_response(409)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_refused_instance_stops_with_the_masters_message_having_run_nothing(master_server, tmp_path):
    server = HTTPServer(("127.0.0.1", 0), RefusingMaster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        shard = new_shard(
            master_server, tmp_path, hosts=0, FLEETSHARD_MASTER_URL=f"http://127.0.0.1:{server.server_address[1]}"
        )
        shard.process.shell(SEED)
        proc = shard.process.role.manage("run_shard", check=False, timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode != 0
    assert "another instance was heard 2 s ago" in proc.stderr
    assert gate_statuses(shard) == [(9001, "Queued"), (9002, "Running")]


def test_the_sqlite_database_and_data_dir_are_closed_to_others(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1)
    (job,) = submit(master_server, [{"name": "j", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    start(shard, started)
    wait_until(lambda: master_status(master_server, job)[1] == "Completed", timeout=60, what="the job")
    data_dir = shard.process.role.data_dir
    assert data_dir.stat().st_mode & 0o777 == 0o711
    for db in data_dir.glob("*.sqlite3"):
        assert db.stat().st_mode & 0o077 == 0
    assert (data_dir / "results").stat().st_mode & 0o777 == 0o711
