"""`run_shard` as a real process against a real master: aborts, a crash and restart, and draining."""

import signal
import subprocess
from pathlib import Path

import pytest

from shard.run.tracking import process_state
from tests.shard.fleet import ACTIVE, in_list, master_hqes, new_shard, sql, submit, writable_by_jobs
from tests.support import Role, stop, wait_until

pytestmark = pytest.mark.e2e


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


def master_status(master, job_id: int) -> tuple:
    (row,) = master_hqes(master, [job_id])
    return row


def shard_hqe(shard, job_id: int) -> tuple:
    rows = sql(
        shard.url,
        "SELECT q.status, q.failure, r.results_dir, r.pid FROM common_hostqueueentry q "
        f"LEFT JOIN shard_run r ON r.hqe_id = q.id WHERE q.job_id = {job_id}",
    )
    return rows[0] if rows else ("", "", "", None)


def start(shard, started, name: str = "run") -> subprocess.Popen:
    proc = shard.process.role.start("run_shard", log_name=f"{name}.log")
    started.append((proc, shard.process.role.data_dir / f"{name}.log"))
    return proc


def log_of(shard, name: str = "run") -> str:
    return (shard.process.role.data_dir / f"{name}.log").read_text(errors="replace")


def test_abort_reaches_sigterm_then_sigkill_and_an_aborted_hqe_on_the_master(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1)
    command = (
        "trap 'echo TERM >> \"$FLEETSHARD_RESULTS_DIR/signals\"' TERM; "
        'echo started > "$FLEETSHARD_RESULTS_DIR/started"; while true; do sleep 0.1; done'
    )
    (job,) = submit(master_server, [{"name": "stubborn", "command": command, "meta_hosts": [[shard.label, 1]]}])
    proc = start(shard, started)
    wait_until(lambda: master_status(master_server, job)[1] == "Running", timeout=60, what="Running on the master")
    # The abort must find the trap set: wait until the job says so.
    wait_until(lambda: Path(shard_hqe(shard, job)[2], "started").exists(), timeout=60, what="the trap set")
    master_server.shell(f"from master import services\nservices.abort_jobs([{job}], acting_user=None)\nresult = 1")
    wait_until(lambda: master_status(master_server, job)[1] == "Aborted", timeout=60, what="Aborted on the master")
    _, _, results_dir, pid = shard_hqe(shard, job)
    assert "TERM" in Path(results_dir, "signals").read_text()
    assert "SIGKILL" in master_status(master_server, job)[5]
    assert not alive(pid)
    assert stop(proc) == 0


def test_shard_killed_mid_job_and_restarted_closes_the_job_as_infra_and_repairs_the_host(
    master_server, tmp_path, started
):
    marker = writable_by_jobs(tmp_path) / "repaired"
    shard = new_shard(master_server, tmp_path, hosts={"dut": {"repair_command": f"touch {marker}"}})
    (host_id,) = shard.hosts.values()
    long_job, next_job = submit(
        master_server,
        [
            {"name": "long", "command": "sleep 300", "meta_hosts": [[shard.label, 1]], "priority": 70},
            {"name": "after", "command": "true", "meta_hosts": [[shard.label, 1]]},
        ],
    )
    first = start(shard, started, "first")
    wait_until(lambda: master_status(master_server, long_job)[1] == "Running", timeout=60, what="the long job")
    _, _, _, pid = shard_hqe(shard, long_job)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert alive(pid), "the job outlives its shard process, so the restart must deal with it"

    start(shard, started, "second")
    wait_until(lambda: master_status(master_server, long_job)[1] == "Failed", timeout=60, what="the infra failure")
    assert master_status(master_server, long_job)[2] == "infra"
    wait_until(lambda: master_status(master_server, next_job)[1] == "Completed", timeout=60, what="the next job")
    assert marker.exists()
    assert not alive(pid)
    assert master_status(master_server, next_job)[4] == host_id
    wait_until(
        lambda: (
            sql(master_server.role.database_url, f"SELECT status FROM common_host WHERE id = {host_id}") == [("Ready",)]
        ),
        timeout=60,
        what="the host Ready on the master",
    )
    active = sql(shard.url, f"SELECT count(*) FROM common_hostqueueentry WHERE status IN {ACTIVE!r}")
    assert active == [(0,)]
    assert "abandoned" in log_of(shard, "second")


def test_sigterm_drains_then_stops_the_rest_as_infra(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=2, FLEETSHARD_DRAIN_S="15")
    (h1, _), (h2, _) = sorted(shard.hosts.items())
    short, long, queued = submit(
        master_server,
        [
            {"name": "short", "command": "sleep 5", "hosts": [h1]},
            {"name": "long", "command": "sleep 300", "hosts": [h2]},
            {"name": "queued", "command": "true", "hosts": [h1]},
        ],
    )
    proc = start(shard, started)

    def both_running() -> bool:
        return all(shard_hqe(shard, j)[0] == "Running" for j in (short, long))

    wait_until(both_running, timeout=60, what="both jobs Running")
    long_pid = shard_hqe(shard, long)[3]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    # The last heartbeat carried the ends to the master before the process exited.
    assert master_status(master_server, short)[1:3] == ("Completed", "")
    assert master_status(master_server, long)[1:3] == ("Failed", "infra")
    assert master_status(master_server, queued)[1] == "Queued"
    assert shard_hqe(shard, queued)[0] == "Queued"
    assert not alive(long_pid)
    running = sql(shard.url, "SELECT count(*) FROM common_hostqueueentry WHERE status IN ('Starting', 'Running')")
    assert running == [(0,)]
    assert "draining" in log_of(shard)


def test_second_sigterm_stops_at_once(master_server, tmp_path, started):
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_DRAIN_S="600", FLEETSHARD_ABORT_GRACE_S="600")
    (job,) = submit(master_server, [{"name": "long", "command": "sleep 300", "meta_hosts": [[shard.label, 1]]}])
    proc = start(shard, started)
    wait_until(lambda: shard_hqe(shard, job)[0] == "Running", timeout=60, what="the job Running")
    pid = shard_hqe(shard, job)[3]
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in log_of(shard), timeout=30, what="the drain to begin")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert shard_hqe(shard, job)[:2] == ("Failed", "infra")
    assert not alive(pid)
    hosts = in_list(list(shard.hosts.values()))
    assert sql(shard.url, f"SELECT status FROM common_host WHERE id IN {hosts}") == [("Ready",)]


def test_repair_failed_host_is_repaired_again_after_an_unlock_on_the_master(master_server, tmp_path, started):
    fixed = tmp_path / "fixed"
    shard = new_shard(master_server, tmp_path, hosts={"dut": {"repair_command": f"test -e {fixed}"}})
    ((hostname, host_id),) = shard.hosts.items()
    (failing,) = submit(master_server, [{"name": "breaks-it", "command": "exit 1", "meta_hosts": [[shard.label, 1]]}])
    start(shard, started)

    def master_host() -> str:
        return sql(master_server.role.database_url, f"SELECT status FROM common_host WHERE id = {host_id}")[0][0]

    wait_until(lambda: master_host() == "Repair Failed", timeout=60, what="Repair Failed on the master")
    (waiting,) = submit(master_server, [{"name": "waits", "command": "true", "meta_hosts": [[shard.label, 1]]}])
    wait_until(lambda: shard_hqe(shard, waiting)[0] == "Queued", timeout=60, what="the job to reach the shard")
    assert master_status(master_server, failing)[1:3] == ("Failed", "test")
    # An operator fixes the device and unlocks the host: its version rises and the shard repairs it again.
    fixed.touch()
    master_server.shell(
        f"from master import services\nservices.unlock_hosts([{hostname!r}], acting_user=None)\nresult = 1"
    )
    wait_until(lambda: master_status(master_server, waiting)[1] == "Completed", timeout=60, what="the waiting job")
    wait_until(lambda: master_host() == "Ready", timeout=60, what="the host Ready on the master")


def test_run_shard_uses_the_configured_executor(master_server, tmp_path, started):
    shard = new_shard(
        master_server, tmp_path, hosts=1, FLEETSHARD_EXECUTOR="tests.shard.custom_executor.TaggingExecutor"
    )
    (job,) = submit(master_server, [{"name": "tagged", "command": "echo hi", "meta_hosts": [[shard.label, 1]]}])
    start(shard, started)
    wait_until(lambda: master_status(master_server, job)[1] == "Completed", timeout=60, what="the job")
    assert master_status(master_server, job)[5].splitlines()[:2] == ["via TaggingExecutor", "hi"]


def test_run_shard_refuses_an_unknown_executor(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_EXECUTOR="shard.run.executor.NoSuchExecutor")
    proc = shard.process.role.manage("run_shard", check=False, timeout=60)
    assert proc.returncode != 0
    assert "FLEETSHARD_EXECUTOR=shard.run.executor.NoSuchExecutor" in proc.stderr


def test_run_shard_under_the_test_settings_says_which_settings_it_needs(tmp_path):
    """The suite's settings play the master (both roles installed): FLEETSHARD_ROLE=shard alone is not enough,
    and the refusal must not tell someone who set it to set it."""
    role = Role("shard", f"sqlite:///{tmp_path / 's.sqlite3'}", tmp_path)
    role.extra_env["DJANGO_SETTINGS_MODULE"] = "server.settings.test"
    proc = role.manage("run_shard", check=False, timeout=60)
    assert proc.returncode == 1
    assert (
        "run_shard needs the shard's settings (FLEETSHARD_ROLE=shard, DJANGO_SETTINGS_MODULE=server.settings), "
        "not server.settings.test, which plays the master"
    ) in proc.stderr


@pytest.mark.parametrize("database", ["never migrated", "the master's"])
def test_run_shard_refuses_a_database_not_migrated_for_the_shard(database, tmp_path):
    """A shard started after an upgrade without `migrate`, or pointed at the master's database, would
    heartbeat 'no such table' forever; it refuses to start, saying what to do."""
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    if database == "the master's":
        Role("master", url, tmp_path).manage("migrate", "--noinput")
    shard = Role("shard", url, tmp_path, {"FLEETSHARD_SHARD_HOSTNAME": "lab1", "FLEETSHARD_SHARD_TOKEN": "fs_x"})
    proc = shard.manage("run_shard", check=False, timeout=60)
    assert proc.returncode == 1
    assert "the database is not migrated for the shard" in proc.stderr
    assert "run `FLEETSHARD_ROLE=shard python manage.py migrate`" in proc.stderr


def test_a_master_out_of_reach_is_one_short_line_per_failure_with_its_cause(tmp_path):
    """No urllib3 retry warnings (settings.LOGGING), no URL paths, no exception chains."""
    from tests.support import free_port

    url = f"http://127.0.0.1:{free_port()}"
    role = Role(
        "shard",
        f"sqlite:///{tmp_path / 's.sqlite3'}",
        tmp_path,
        {
            "FLEETSHARD_MASTER_URL": url,
            "FLEETSHARD_SHARD_HOSTNAME": "lab",
            "FLEETSHARD_SHARD_TOKEN": "fs_x",
            "FLEETSHARD_CGROUP_NAME": f"fleetshard-unreachable-{tmp_path.name}",
        },
    )
    role.manage("migrate", "--noinput")
    proc = role.start("run_shard", log_name="shard.log")
    log = tmp_path / "shard.log"
    try:
        wait_until(lambda: log.read_text().count("heartbeat failed") >= 2, timeout=30, what="two failed heartbeats")
    finally:
        stop(proc)
    failures = [line for line in log.read_text().splitlines() if "heartbeat failed" in line]
    assert all(f"heartbeat failed (cannot reach the master at {url}: connection refused); retrying in " in f
               for f in failures), failures  # fmt: skip
    assert "Retrying (Retry(" not in log.read_text() and "Traceback" not in log.read_text()
