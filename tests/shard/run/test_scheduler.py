"""The scheduler, the local executor and the host lifecycle, in process with real commands.

Hosts and jobs reach the shard's database through `apply_response`, as they would from the master.
A "minute" is one second here (SchedulerConfig.minute_s), so timeouts take seconds.
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from common.models import Host, HostQueueEntry
from shard.locks import shard_write
from shard.models import HostState, OutboxEntry
from shard.run.tracking import process_state
from shard.services import move_host
from tests.shard.world import ShardWorld, make_world


def process_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie is dead; only its reaper can clear it)."""
    return process_state(pid) not in (None, "Z")


def test_exit_status_decides_completed_or_failed_test(world):
    world.host("h1", ("board:a",))
    world.host("h2", ("board:a",))
    ok = world.job("echo fine", meta_host="board:a")
    bad = world.job("echo broken >&2; exit 3", meta_host="board:a")
    world.run_until(lambda: world.finished(ok, bad) and world.idle(), what="both jobs")
    good, failed = world.hqe(ok), world.hqe(bad)
    assert (good.status, good.failure, good.exit_code) == ("Completed", "", 0)
    assert (failed.status, failed.failure, failed.exit_code) == ("Failed", "test", 3)
    assert "fine" in good.log_tail and "broken" in failed.log_tail
    # Starting, Running and the end all went to the outbox, in order.
    statuses = [e.payload["status"] for e in OutboxEntry.objects.filter(hqe_id=good.id).order_by("seq")]
    assert statuses == ["Starting", "Running", "Completed"]


def test_job_environment_results_dir_and_log_tail(world, monkeypatch):
    monkeypatch.setenv("FLEETSHARD_SHARD_TOKEN", "secret-token")
    monkeypatch.setenv("DATABASE_URL", "postgres://secret")
    host = world.host("dut-1", ("board:a",), attributes={"serial": "X1", "usb.port": "3"})
    command = (
        'env | grep "^FLEETSHARD_\\|^DATABASE_URL" | sort; pwd; '
        'echo "$FLEETSHARD_HQE_ID" > "$FLEETSHARD_RESULTS_DIR/hqe"; '
        "head -c 40000 /dev/zero | tr '\\0' x; echo; echo last-line"
    )
    job = world.job(
        command,
        meta_host="board:a",
        keyvals={"build": "R120", "shared": "from-job"},
        parent=(77, {"suite": "bvt", "shared": "from-suite"}),
    )
    world.run_until(lambda: world.finished(job), what="the job")
    hqe = world.hqe(job)
    results = Path(hqe.run.results_dir)
    assert results.parent.parent == world.config.results_root
    assert (results / "hqe").read_text().strip() == str(hqe.id)
    log = (results / "job.log").read_text()
    for line in (
        f"FLEETSHARD_JOB_ID={job}",
        f"FLEETSHARD_HQE_ID={hqe.id}",
        "FLEETSHARD_HOSTNAME=dut-1",
        f"FLEETSHARD_RESULTS_DIR={results}",
        "FLEETSHARD_HOST_ATTR_SERIAL=X1",
        "FLEETSHARD_HOST_ATTR_USB_PORT=3",
        "FLEETSHARD_KEYVAL_BUILD=R120",
        "FLEETSHARD_KEYVAL_SUITE=bvt",
        "FLEETSHARD_KEYVAL_SHARED=from-job",
    ):
        assert line in log.splitlines(), line
    assert "secret" not in log
    assert str(results) in log.splitlines()  # the working directory
    assert len(hqe.log_tail.encode()) <= 16 * 1024 and hqe.log_tail.rstrip().endswith("last-line")
    assert len(log) > 40000
    assert Host.objects.get(id=host).status == "Ready"


def test_priority_then_age_decide_the_order(world):
    world.host("only", ("board:a",))
    now = timezone.now()
    low = world.job("true", meta_host="board:a", priority=10, created_on=now - timedelta(seconds=50))
    old = world.job("true", meta_host="board:a", priority=40, created_on=now - timedelta(seconds=40))
    high = world.job("true", meta_host="board:a", priority=70, created_on=now - timedelta(seconds=10))
    new = world.job("true", meta_host="board:a", priority=40, created_on=now - timedelta(seconds=20))
    world.run_until(lambda: world.finished(low, old, high, new), what="all four jobs")
    order = [h.job_id for h in HostQueueEntry.objects.order_by("started_on")]
    assert order == [high, old, new, low]


def test_locked_host_is_never_given_work(world):
    locked = world.host("locked", ("board:a",), locked=True)
    free = world.host("free", ("board:a",))
    jobs = [world.job("true", meta_host="board:a") for _ in range(3)]
    named = world.job("true", host=locked)
    world.run_until(lambda: world.finished(*jobs), what="the meta-host jobs")
    assert {world.hqe(j).host_id for j in jobs} == {free}
    for _ in range(10):
        world.scheduler.tick()
    assert world.hqe(named).status == "Queued"
    assert world.host_status(locked) == "Ready"


def test_meta_host_needs_every_dependency_label(world):
    a1 = world.host("a1", ("board:a",))
    a2 = world.host("a2", ("board:a", "wifi"))
    b1 = world.host("b1", ("board:b", "wifi"))
    wifi_a = world.job("true", meta_host="board:a", deps=("wifi",))
    wifi_b = world.job("true", meta_host="wifi", deps=("board:b",))
    named = world.job("true", host=a1)
    nowhere = world.job("true", meta_host="board:a", deps=("wifi", "nfc"))
    world.run_until(lambda: world.finished(wifi_a, wifi_b, named), what="the servable jobs")
    assert world.hqe(wifi_a).host_id == a2
    assert world.hqe(wifi_b).host_id == b1
    assert world.hqe(named).host_id == a1
    world.run_until(world.idle, what="hosts back to Ready")
    for _ in range(5):
        world.scheduler.tick()
    assert world.hqe(nowhere).status == "Queued"


def test_concurrent_runs_are_limited(tmp_path, db, request):
    world = make_world(tmp_path, request, max_runs=2)
    for n in range(4):
        world.host(f"h{n}", ("board:a",))
    jobs = [world.job("sleep 0.3", meta_host="board:a") for _ in range(6)]
    most = 0

    def done() -> bool:
        nonlocal most
        most = max(most, HostQueueEntry.objects.filter(status__in=("Starting", "Running")).count())
        return world.finished(*jobs)

    world.run_until(done, what="six jobs")
    assert most == 2
    assert all(world.hqe(j).status == "Completed" for j in jobs)


def test_max_runtime_kills_the_whole_process_group(world):
    host = world.host("h1", ("board:a",))
    command = 'sleep 300 & echo $! > "$FLEETSHARD_RESULTS_DIR/grandchild"; echo started; sleep 300'
    job = world.job(command, meta_host="board:a", max_runtime_mins=1)
    world.run_until(lambda: world.finished(job), what="the timeout")
    hqe = world.hqe(job)
    assert (hqe.status, hqe.failure) == ("Failed", "timeout")
    grandchild = int((Path(hqe.run.results_dir) / "grandchild").read_text())
    assert not process_alive(grandchild)
    assert not process_alive(hqe.run.pid)
    assert "max_runtime_mins reached" in hqe.log_tail
    world.run_until(lambda: world.host_status(host) == "Ready", what="the host to be Ready")


def test_abort_sends_sigterm_then_sigkill(world):
    world.host("h1", ("board:a",))
    command = (
        "trap 'echo TERM >> \"$FLEETSHARD_RESULTS_DIR/signals\"' TERM; "
        'echo started > "$FLEETSHARD_RESULTS_DIR/started"; '
        "while true; do sleep 0.1; done"
    )
    job = world.job(command, meta_host="board:a")
    world.run_until(lambda: (results := world.results_dir(job)) and Path(results, "started").exists())
    world.abort(job)
    world.run_until(lambda: world.finished(job), what="the abort")
    hqe = world.hqe(job)
    assert hqe.status == "Aborted" and hqe.failure == ""
    assert "TERM" in Path(hqe.run.results_dir, "signals").read_text()
    assert "SIGKILL" in hqe.log_tail
    assert not process_alive(hqe.run.pid)


def test_abort_of_a_job_that_obeys_sigterm_needs_no_sigkill(world):
    world.host("h1", ("board:a",))
    job = world.job('echo started > "$FLEETSHARD_RESULTS_DIR/started"; exec sleep 300', meta_host="board:a")
    world.run_until(lambda: (results := world.results_dir(job)) and Path(results, "started").exists())
    world.abort(job)
    world.run_until(lambda: world.finished(job), what="the abort")
    hqe = world.hqe(job)
    assert hqe.status == "Aborted" and hqe.exit_code == 128 + 15
    assert "SIGKILL" not in hqe.log_tail


def test_hqe_still_queued_after_timeout_mins_expires(world):
    world.host("busy", ("board:a",), locked=True)
    stale = world.job("true", meta_host="board:a", timeout_mins=5, created_on=timezone.now() - timedelta(seconds=30))
    fresh = world.job("true", meta_host="board:a", timeout_mins=600)
    world.run_until(lambda: world.finished(stale), what="the expiry")
    assert world.hqe(stale).status == "Expired"
    assert world.hqe(fresh).status == "Queued"
    assert [e.payload["status"] for e in OutboxEntry.objects.filter(hqe_id=world.hqe(stale).id)] == ["Expired"]


def test_failed_job_is_followed_by_its_repair_then_ready(world, tmp_path):
    marker = tmp_path / "repaired"
    host = world.host(
        "h1", ("board:a",), attributes={"repair_command": f'sleep 0.5; echo "$FLEETSHARD_HOSTNAME" > {marker}'}
    )
    job = world.job("exit 1", meta_host="board:a")
    seen: list[str] = []

    def ready_again() -> bool:
        status = world.host_status(host)
        if not seen or seen[-1] != status:
            seen.append(status)
        return world.finished(job) and status == "Ready" and not world.scheduler.busy

    world.run_until(ready_again, what="the repair")
    assert "Repairing" in seen and seen[-1] == "Ready"
    assert marker.read_text().strip() == "h1"
    assert world.hqe(job).failure == "test"


def test_shard_wide_repair_command_is_used_without_a_host_attribute(tmp_path, db, request):
    marker = tmp_path / "repaired"
    world = make_world(tmp_path, request, repair_command=f"touch {marker}")
    host = world.host("h1", ("board:a",))
    job = world.job("false", meta_host="board:a")
    world.run_until(lambda: world.finished(job) and world.idle(), what="the repair")
    assert marker.exists() and world.host_status(host) == "Ready"


def test_failing_repair_leaves_repair_failed_until_the_config_changes(world, tmp_path):
    host = world.host("h1", ("board:a",), attributes={"repair_command": "echo no luck; exit 7"})
    first = world.job("false", meta_host="board:a")
    world.run_until(lambda: world.host_status(host) == "Repair Failed", what="Repair Failed")
    second = world.job("true", meta_host="board:a")
    for _ in range(20):
        world.scheduler.tick()
        time.sleep(0.02)
    assert world.hqe(second).status == "Queued"
    assert world.host_state(host).repair_failed_version == 1
    assert world.hqe(first).failure == "test"
    # The master changes the host (a new repair command; an unlock would do too): the shard tries again.
    world.host("h1", ("board:a",), attributes={"repair_command": "true"}, version=2, host_id=host)
    world.run_until(lambda: world.finished(second), what="the second job")
    assert world.hqe(second).status == "Completed" and world.hqe(second).host_id == host


def test_cleanup_then_cooldown_before_the_next_job(tmp_path, db, request):
    world = make_world(tmp_path, request, cooldown_s=1.5)
    marker = tmp_path / "cleaned"
    host = world.host("h1", ("board:a",), attributes={"cleanup_command": f"echo clean >> {marker}"})
    first = world.job("true", meta_host="board:a")
    second = world.job("true", meta_host="board:a")
    seen: list[str] = []

    def both_done() -> bool:
        status = world.host_status(host)
        if not seen or seen[-1] != status:
            seen.append(status)
        return world.finished(first, second) and world.idle()

    world.run_until(both_done, what="both jobs")
    assert marker.read_text().splitlines() == ["clean", "clean"]
    assert seen.count("Cleaning") == 2 and "Repairing" not in seen
    gap = world.hqe(second).started_on - world.hqe(first).finished_on
    assert gap >= timedelta(seconds=1.5)


def test_failed_cleanup_sends_the_host_to_repair(world, tmp_path):
    marker = tmp_path / "repaired"
    host = world.host("h1", ("board:a",), attributes={"cleanup_command": "exit 1", "repair_command": f"touch {marker}"})
    job = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(job) and world.idle(), what="cleanup and repair")
    assert marker.exists() and world.host_status(host) == "Ready"
    assert world.hqe(job).status == "Completed"


def test_job_that_cannot_start_is_an_infra_failure(world, tmp_path):
    world.config.results_root.parent.mkdir(parents=True, exist_ok=True)
    world.config.results_root.write_text("not a directory")
    world.host("h1", ("board:a",))
    job = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the failure")
    assert (world.hqe(job).status, world.hqe(job).failure) == ("Failed", "infra")


def test_no_process_outlives_a_finished_job(world):
    world.host("h1", ("board:a",))
    job = world.job('sleep 300 & echo $! > "$FLEETSHARD_RESULTS_DIR/bg"; exit 0', meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the job")
    hqe = world.hqe(job)
    assert hqe.status == "Completed"
    assert not process_alive(int(Path(hqe.run.results_dir, "bg").read_text()))
    assert os.path.isdir(hqe.run.results_dir)


def test_a_hostname_cannot_move_results_out_of_the_results_root(world):
    world.host("../../escape", ("board:a",), attributes={"cleanup_command": "true"})
    job = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(job) and world.idle(), what="the job and its cleanup")
    root = world.config.results_root.resolve()
    assert Path(world.results_dir(job)).resolve().is_relative_to(root)
    assert not (root.parent.parent / "escape").exists()
    assert all(p.resolve().is_relative_to(root) for p in root.rglob("*"))


def test_another_executor_plugs_in_without_touching_the_scheduler(tmp_path, db, request):
    from shard.run.scheduler import Scheduler
    from tests.shard.custom_executor import TaggingExecutor

    world = make_world(tmp_path, request)
    world.scheduler = Scheduler(world.config, TaggingExecutor())
    world.host("h1", ("board:a",))
    job = world.job("echo payload", meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the job")
    assert world.hqe(job).status == "Completed"
    assert world.hqe(job).log_tail.splitlines()[:2] == ["via TaggingExecutor", "payload"]


@pytest.mark.postgres_only(reason="terminates the test's own PostgreSQL connection (pg_terminate_backend)")
def test_a_lost_database_connection_costs_one_phase_and_the_tick_goes_on(transactional_db, tmp_path, caplog):
    """Found by the chaos run: after a terminated connection every later phase of the tick failed with
    Django's InterfaceError ("connection already closed") until the next tick."""
    import psycopg2
    from django.db import connection

    world = ShardWorld(tmp_path)
    try:
        world.host("h1", ("board:a",))
        job = world.job("true", meta_host="board:a")
        params = connection.get_connection_params()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        killer = psycopg2.connect(**params)
        killer.autocommit = True
        with killer.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        killer.close()
        world.scheduler.tick()
        assert "InterfaceError" not in caplog.text and "connection already closed" not in caplog.text
        assert world.hqe(job).status in ("Starting", "Running", "Completed"), "the same tick started the job"
        world.run_until(lambda: world.finished(job), what="the job")
    finally:
        world.stop()


def test_scheduling_and_moving_hosts_cost_pinned_queries(db, tmp_path, request, django_assert_num_queries):
    """A start costs the same whatever else is queued; a host's move takes the shard's write lock, and a
    seq and an insert for its host event (4 queries: the timeline's record of the move)."""
    world = make_world(tmp_path, request, recover_every_s=3600)
    for i in range(7):
        world.host(f"h{i}", ("board:a",))
    with django_assert_num_queries(4):
        world.scheduler.recover()
    world.job("sleep 30", meta_host="board:a")
    with django_assert_num_queries(5 + 36):
        world.scheduler._schedule()
    for _ in range(5):
        world.job("sleep 30", meta_host="board:a")
    with django_assert_num_queries(5 + 5 * 36):
        world.scheduler._schedule()
    assert len(world.scheduler.runs) == 6
    with django_assert_num_queries(7):
        world.scheduler.tick()
    (spare,) = Host.objects.filter(status="Ready").values_list("id", flat=True)
    with shard_write():
        move_host(spare, "Running", held_by="", holder=world.scheduler.runner_id)
    with django_assert_num_queries(19):
        world.scheduler.hosts.after_job(spare, ok=False)  # no repair command: Repairing, then Ready
    assert (world.host_status(spare), world.host_state(spare).runner) == ("Ready", "")


def test_a_host_without_its_state_row_gets_one_at_recovery_rather_than_being_skipped_forever(db, tmp_path, request):
    """A host with no HostState (written by another path than ingest, or by an old shard process during
    the upgrade) was matched by no scheduling, lifecycle or recovery query: Ready and never used, or
    Running and never taken back."""
    world = make_world(tmp_path, request, recover_every_s=3600)
    ready = world.host("h1", ("board:a",))
    left = world.host("h2", ("board:b",))
    Host.objects.filter(id=left).update(status="Running")
    HostState.objects.all().delete()
    job = world.job("true", meta_host="board:a")
    try:
        world.scheduler.recover()
        assert world.host_state(ready).runner == ""
        assert world.host_status(left) in ("Repairing", "Ready"), "left Running by nobody: taken back"
        world.scheduler._schedule()
        assert world.hqe(job).status != "Queued"
        world.run_until(lambda: world.finished(job), what="the job")
    finally:
        world.stop()
