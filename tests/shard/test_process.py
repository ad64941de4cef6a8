"""`ShardProcess` in this process against a real master: when it schedules, how it stops, what the master learns.

The test database is the shard's; the master runs under gunicorn on its own database. Signals are
delivered as `on_signal` calls, which is all the command's handlers do.
"""

import logging
import signal
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

import shard.process as shard_process
from common.constants import FailureClass, HostStatus, HQEStatus
from common.models import Host, HostQueueEntry
from shard.config import SchedulerConfig
from shard.models import HostState, OutboxEntry
from shard.process import ShardProcess
from shard.run.scheduler import Scheduler
from shard.sync.client import HeartbeatClient
from tests.shard.world import apply_wire
from tests.support import Master, free_port, wait_until

pytestmark = pytest.mark.e2e

DEAD_RUNNER = f"{socket.gethostname()}:999999999:0"


def lab(master: Master, command: str, jobs: int = 1) -> dict[str, Any]:
    """A shard with one host and `jobs` jobs of one HQE on the master (`job`: the first one's id)."""
    prefix = f"p{uuid.uuid4().hex[:6]}"
    return master.shell(
        f"""
from master import services
label = "{prefix}:board"
services.create_labels([label], acting_user=None)
shard, token = services.create_shard("{prefix}.lab", [label], acting_user=None)
services.create_hosts(["{prefix}-h0"], labels=[label], acting_user=None)
request = services.JobRequest(name="{prefix}-j", owner="ana", command={command!r}, meta_hosts=[(label, 1)])
made = [services.create_job(request, acting_user=None) for _ in range({jobs})]
result = {{"shard": shard.hostname, "shard_id": shard.id, "token": token, "job": made[0].id,
          "jobs": [j.id for j in made]}}
"""
    )


def master_hqe(master: Master, job_id: int) -> list[str]:
    return master.shell(
        f"from common.models import HostQueueEntry\n"
        f"result = list(HostQueueEntry.objects.filter(job_id={job_id}).values_list('status', 'failure').get())"
    )


class Running:
    """A ShardProcess run in a thread, as run_shard runs it in its main thread."""

    def __init__(
        self,
        url: str,
        world: dict[str, Any],
        tmp_path: Path,
        drain_s: float,
        exit_when_idle_s: float | None = None,
        **scheduler_options: Any,
    ) -> None:
        client = HeartbeatClient(url, world["shard"], world["token"])
        config = SchedulerConfig(results_root=tmp_path / "results", tick_s=0.05, abort_grace_s=1.0)
        scheduler = Scheduler(config)
        for name, value in scheduler_options.items():
            setattr(scheduler, name, value)  # an elastic worker's options (run_shard sets them so)
        self.process = ShardProcess(client, scheduler, drain_s=drain_s, exit_when_idle_s=exit_when_idle_s)
        self.thread = threading.Thread(target=self.process.run, name="shard")
        self.thread.start()

    def ended(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def stop(self) -> None:
        self.process.stop_at_once()
        self.thread.join(30)


@pytest.fixture
def running(transactional_db, settings, tmp_path):
    settings.FLEETSHARD_HEARTBEAT_INTERVAL_S = 0.2
    made: list[Running] = []

    def start(url: str, world: dict[str, Any], drain_s: float = 60.0, **options: Any) -> Running:
        made.append(Running(url, world, tmp_path, drain_s, **options))
        return made[-1]

    yield start
    for r in made:
        r.stop()


def hqe_row(job_id: int) -> tuple[str, str, int | None]:
    return HostQueueEntry.objects.filter(job_id=job_id).values_list("status", "failure", "run__pid").get()


def test_sigterm_drains_then_stops_the_run_as_infra_and_tells_the_master(master_server, running):
    world = lab(master_server, "sleep 300")
    shard = running(master_server.url, world, drain_s=0.5)
    wait_until(
        lambda: HostQueueEntry.objects.filter(job_id=world["job"], status=HQEStatus.RUNNING).exists(),
        timeout=60,
        what="the job running",
    )
    shard.process.on_signal(signal.SIGTERM)
    assert shard.ended(30), "the shard did not stop after the drain"
    status, failure, pid = hqe_row(world["job"])
    assert (status, failure) == (HQEStatus.FAILED, FailureClass.INFRA)
    assert not Path(f"/proc/{pid}").exists()
    # The last heartbeats carried the end: nothing waits in the outbox and the master knows.
    assert not OutboxEntry.objects.exists()
    assert master_hqe(master_server, world["job"]) == ["Failed", "infra"]
    assert shard.process.fatal is None


def test_a_second_sigterm_kills_at_once(master_server, running):
    world = lab(master_server, "sleep 300")
    shard = running(master_server.url, world, drain_s=300)
    wait_until(
        lambda: HostQueueEntry.objects.filter(job_id=world["job"], status=HQEStatus.RUNNING).exists(),
        timeout=60,
        what="the job running",
    )
    shard.process.on_signal(signal.SIGTERM)
    assert not shard.ended(1), "a first SIGTERM must wait for the drain"
    shard.process.on_signal(signal.SIGTERM)
    assert shard.ended(15), "a second SIGTERM must stop at once"
    status, failure, pid = hqe_row(world["job"])
    assert (status, failure) == (HQEStatus.FAILED, FailureClass.INFRA)
    assert not Path(f"/proc/{pid}").exists()


def abandoned_host() -> int:
    """A host a dead scheduler process left Running: the first recovery would repair it."""
    apply_wire(
        {
            "hosts": [
                {
                    "id": 9001,
                    "version": 1,
                    "hostname": "left-behind",
                    "labels": [],
                    "locked": False,
                    "lock_reason": "",
                    "attributes": {},
                }
            ]
        }
    )
    Host.objects.filter(id=9001).update(status=HostStatus.RUNNING)
    HostState.objects.filter(host_id=9001).update(runner=DEAD_RUNNER)
    return 9001


def test_a_refused_instance_stops_the_shard_before_the_scheduler_starts(master_server, running):
    world = lab(master_server, "true")
    # Another database of this shard was heard just now: the master refuses this one.
    master_server.shell(
        "from common.models import Shard\nfrom django.utils import timezone\n"
        f"Shard.objects.filter(id={world['shard_id']})"
        f".update(instance='{uuid.uuid4()}', last_heartbeat=timezone.now())\n"
        "result = 1"
    )
    host_id = abandoned_host()
    shard = running(master_server.url, world)
    assert shard.ended(30), "a refused shard must stop on its own"
    assert "running from another database" in (shard.process.fatal or "")
    assert not shard.process.scheduler_started
    held = Host.objects.filter(id=host_id).values_list("status", "state__runner").get()
    assert held == (HostStatus.RUNNING, DEAD_RUNNER)
    assert not HostQueueEntry.objects.exists()


def test_a_shard_told_to_stop_before_any_master_answers_never_schedules(running, tmp_path):
    world = {"shard": "nowhere.lab", "token": "fs_unused"}
    host_id = abandoned_host()
    shard = running(f"http://127.0.0.1:{free_port()}", world)
    assert not shard.ended(1), "with no master the shard waits"
    shard.process.on_signal(signal.SIGTERM)
    assert shard.ended(15)
    assert not shard.process.scheduler_started and shard.process.fatal is None
    held = Host.objects.filter(id=host_id).values_list("status", "state__runner").get()
    assert held == (HostStatus.RUNNING, DEAD_RUNNER)


def test_a_sigint_while_the_last_heartbeat_hangs_still_stops_at_once(running):
    """A master that takes the connection and never answers holds the heartbeat thread for its whole
    read timeout; a SIGINT (or second SIGTERM) meanwhile means at once, not after that timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        world = {"shard": "silent.lab", "token": "fs_unused"}
        shard = running(f"http://127.0.0.1:{silent.getsockname()[1]}", world)
        silent.settimeout(15)
        # The long-poll may connect first: the heartbeat is in flight once its POST has come.
        held = []
        while not held or not held[-1].recv(5, socket.MSG_PEEK).startswith(b"POST "):
            held.append(silent.accept()[0])
            held[-1].settimeout(15)
        try:
            shard.process.on_signal(signal.SIGTERM)
            assert not shard.ended(1), "a first SIGTERM waits for the heartbeat in flight"
            shard.process.on_signal(signal.SIGINT)
            assert shard.ended(5), "SIGINT must stop at once, whatever the heartbeat thread is waiting for"
        finally:
            for conn in held:
                conn.close()


@pytest.mark.parametrize(
    ("option", "value", "line"),
    [
        ("max_starts", 1, "1 runs started and ended: exiting (--exit-after-num-runs)"),
        ("max_work_dir_bytes", 4000, "work directory over --max-work-dir-size and its runs ended: exiting"),
    ],
    ids=["exit-after-num-runs", "max-work-dir-size"],
)
def test_a_worker_done_by_its_option_exits_once_its_runs_end_not_after_idling(
    master_server, running, caplog, option, value, line
):
    """A worker over --max-work-dir-size stayed, idle, until --exit-when-idle: its free-looking hosts kept
    the manager from starting a fresh worker for the queued work that long."""
    world = lab(master_server, 'head -c 5000 /dev/zero > "$FLEETSHARD_RESULTS_DIR/blob"', jobs=2)
    shard = running(master_server.url, world, exit_when_idle_s=300, **{option: value})
    with caplog.at_level(logging.INFO, logger="shard.run_shard"):
        assert shard.ended(60), "the worker is done: it leaves once its run has ended"
    assert shard.process.exited_idle and line in caplog.messages
    first, second = world["jobs"]
    assert hqe_row(first)[0] == HQEStatus.COMPLETED and hqe_row(second)[0] == HQEStatus.QUEUED


def test_a_database_error_reading_the_instance_id_is_retried_not_a_crash(master_server, running, monkeypatch):
    """Once accepted, a process checks every interval that the database still holds the instance id it
    was accepted under: a database that fails that read (a restart) must neither end the process nor
    stop it as if the database had taken a new id."""
    real = shard_process.current_instance
    failures = {"left": 2}

    def flaky() -> str | None:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("the database restarts")
        return real()

    monkeypatch.setattr(shard_process, "current_instance", flaky)
    world = lab(master_server, "sleep 1")
    running_shard = running(master_server.url, world)
    wait_until(
        lambda: master_hqe(master_server, world["job"])[0] == "Completed",
        timeout=60,
        what="the job to complete",
    )
    assert running_shard.thread.is_alive(), "a database error reading the instance id ended the process"
    assert running_shard.process.fatal is None
    wait_until(lambda: not failures["left"], timeout=10, what="both failing reads")
    assert running_shard.process.scheduler_started and running_shard.thread.is_alive()
