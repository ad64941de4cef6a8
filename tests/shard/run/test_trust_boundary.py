"""A job is untrusted input, and one bad record is one bad record: the scheduler in process with real commands.

Output with NUL bytes, a host whose config cannot be used, an HQE left half-started, secrets in the
shard's environment, processes that leave their process group, endless output and old results.
"""

import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from common.models import Host, HostQueueEntry
from shard.config import SchedulerConfig
from shard.locks import shard_write
from shard.models import HostState, OutboxEntry
from shard.run.executor import LocalExecutor
from shard.run.isolation import make_traversable, resolve_job_user
from shard.run.scheduler import Scheduler
from shard.run.tracking import CGROUP_V2, FREEZER, PIDS, detect, process_state, remove_cgroup, slug
from shard.run.workspace import remove_old_results
from shard.services import open_run, record_run, transition_hqe
from tests.shard.world import ShardWorld, make_world
from tests.support import ROOT, wait_until

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run jobs as another user")


def processes_running(needle: str) -> list[int]:
    """Live processes whose command line holds `needle`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline and process_state(int(entry)) not in (None, "Z"):
            found.append(int(entry))
    return found


def unique_sleep() -> str:
    """A sleep no other test (or engineer) runs, so looking for it finds only this test's."""
    return f"sleep 411{uuid.uuid4().int % 10**6:06d}"


# Finding 1: a job's output is untrusted text.


def test_nul_and_undecodable_output_end_as_replacement_characters_and_the_host_runs_on(world):
    host = world.host("h1", ("board:a",))
    dirty = world.job(r"printf 'a\000b\355\240\200c\n'", meta_host="board:a", priority=70)
    after = world.job("echo next", meta_host="board:a")
    world.run_until(lambda: world.finished(dirty, after), what="both jobs")
    tail = world.hqe(dirty).log_tail
    assert world.hqe(dirty).status == "Completed"
    assert "a\ufffdb" in tail and "\x00" not in tail
    assert not any("\ud800" <= ch <= "\udfff" for ch in tail)
    sent = OutboxEntry.objects.filter(hqe_id=world.hqe(dirty).id).order_by("-seq").first().payload["log_tail"]
    assert "\x00" not in sent
    assert world.hqe(after).status == "Completed" and world.hqe(after).host_id == host


def test_transition_hqe_cleans_any_log_tail_it_is_given(world):
    world.host("h1", ("board:a",), locked=True)
    job = world.job("true", meta_host="board:a")
    hqe = world.hqe(job)
    with shard_write():
        transition_hqe(hqe.id, "Failed", failure="infra", log_tail="nul\x00 and \ud800 lone")
    assert HostQueueEntry.objects.get(id=hqe.id).log_tail == "nul\ufffd and \ufffd lone"


# Finding 2: one bad HQE or host fails alone.


def test_a_host_whose_attributes_are_not_an_object_fails_its_hqe_and_nothing_else(world):
    bad = world.host("bad", ("board:b",))
    # The wire refuses such a record; a database written by an older master may still hold one.
    Host.objects.filter(id=bad).update(attributes=["not", "an", "object"])
    good = world.host("good", ("board:a",))
    on_bad = world.job("true", host=bad)
    on_good = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(on_bad, on_good), what="both jobs")
    failed = world.hqe(on_bad)
    assert (failed.status, failed.failure) == ("Failed", "infra")
    assert "attributes must be a JSON object" in failed.log_tail
    assert world.hqe(on_good).status == "Completed" and world.hqe(on_good).host_id == good
    world.run_until(lambda: world.host_status(bad) == "Repair Failed", what="the bad host set aside")
    later = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(later), what="a later job")
    assert world.hqe(later).status == "Completed"


def test_an_hqe_this_process_left_starting_is_closed_and_its_host_repaired(world):
    host = world.host("h1", ("board:a",))
    stuck = world.job("true", meta_host="board:a")
    hqe_id = world.hqe(stuck).id
    # What a start that failed half-way leaves: the HQE Starting and the host Running, both ours.
    Host.objects.filter(id=host).update(status="Running")
    HostState.objects.filter(host_id=host).update(runner=world.scheduler.runner_id)
    with shard_write():
        transition_hqe(hqe_id, "Starting", host_id=host)
        open_run(hqe_id, world.scheduler.runner_id)
    after = world.job("true", meta_host="board:a")
    world.run_until(lambda: world.finished(stuck, after), what="the stuck HQE closed and the next job run")
    assert (world.hqe(stuck).status, world.hqe(stuck).failure) == ("Failed", "infra")
    assert world.hqe(after).status == "Completed"


# Finding 3: jobs get no secrets.


def test_the_job_environment_is_an_allowlist_plus_what_the_operator_passes(tmp_path, db, request, monkeypatch):
    secrets = {
        "FLEETSHARD_SHARD_TOKEN": "token-secret-1",
        "DATABASE_URL": "postgres://u:db-secret-2@h/x",
        "SECRET_KEY": "django-secret-3",
        "PGPASSWORD": "pg-secret-4",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-5",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("TOOLCHAIN", "/opt/tools")
    world = make_world(tmp_path, request, env_passthrough=("TOOLCHAIN",))
    host = world.host("h1", ("board:a",), attributes={"cleanup_command": "env"})
    job = world.job("env", meta_host="board:a")
    world.run_until(lambda: world.finished(job) and world.idle(), what="the job and its cleanup")
    results = Path(world.results_dir(job))
    (cleanup_log,) = world.config.results_root.glob("hosts/h1/cleanup-*/cleanup.log")
    for log in ((results / "job.log").read_text(), cleanup_log.read_text()):
        names = {line.split("=", 1)[0] for line in log.splitlines() if "=" in line}
        for value in secrets.values():
            assert value not in log
        assert {"PATH", "HOME", "LC_ALL", "TOOLCHAIN", "FLEETSHARD_HOSTNAME", "FLEETSHARD_RESULTS_DIR"} <= names
        assert not names & {"PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL", "SECRET_KEY", "USER"}
    assert f"HOME={results}" in (results / "job.log").read_text().splitlines()
    assert world.host_status(host) == "Ready"


@as_root
def test_as_root_jobs_run_as_the_job_user_in_a_results_dir_of_their_own(tmp_path, db, request):
    user = resolve_job_user("nobody")
    assert user is not None
    world = make_world(tmp_path, request, job_user=user)
    make_traversable(world.config.results_root, user)
    secret = tmp_path / "w" / "secret"
    secret.write_text("shard-only")
    secret.chmod(0o600)
    world.host("h1", ("board:a",))
    command = (
        'id -u; touch "$FLEETSHARD_RESULTS_DIR/mine" && echo wrote; '
        f"cat {secret} || echo no-secret; ls {world.config.results_root} || echo no-listing"
    )
    job = world.job(command, meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the job")
    hqe = world.hqe(job)
    lines = hqe.log_tail.splitlines()
    assert lines[0] == str(user.uid)
    assert {"wrote", "no-secret", "no-listing"} <= set(lines)
    assert "shard-only" not in hqe.log_tail
    assert Path(hqe.run.results_dir, "mine").stat().st_uid == user.uid


@as_root
def test_a_parent_tightened_after_start_is_opened_again_for_the_next_run(tmp_path, db, request):
    """Found by the suite under load: another pytest session made /tmp/pytest-of-root 0700 again while
    a shard ran, and its jobs' writes to $FLEETSHARD_RESULTS_DIR failed without a word."""
    user = resolve_job_user("nobody")
    assert user is not None
    world = make_world(tmp_path, request, job_user=user)
    make_traversable(world.config.results_root, user)
    world.host("h1", ("board:a",))
    tmp_path.chmod(0o700)
    job = world.job('echo hi > "$FLEETSHARD_RESULTS_DIR/out"', meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the job")
    assert world.hqe(job).status == "Completed", world.hqe(job).log_tail
    assert Path(world.results_dir(job), "out").read_text() == "hi\n"


@as_root
def test_a_parent_tightened_during_a_run_fails_it_as_infra_not_as_the_test(tmp_path, db, request):
    """Found by CI under load: another pytest session made /tmp/pytest-of-root 0700 again while a job ran,
    and `cmp $FLEETSHARD_INPUT_DIR/w` failed "Permission denied", reported as the test's failure. The
    job here waits (by a relative path: its working directory stays open) until the parent is tightened."""
    user = resolve_job_user("nobody")
    assert user is not None
    world = make_world(tmp_path, request, job_user=user)
    make_traversable(world.config.results_root, user)
    host = world.host("h1", ("board:a",))
    job = world.job('until [ -e go ]; do sleep 0.05; done; cat "$FLEETSHARD_RESULTS_DIR/go"', meta_host="board:a")
    world.run_until(lambda: world.results_dir(job), what="the run")
    tmp_path.chmod(0o700)
    Path(world.results_dir(job), "go").write_text("")
    world.run_until(lambda: world.finished(job), what="the job")
    hqe = world.hqe(job)
    assert (hqe.status, hqe.failure) == ("Failed", "infra"), hqe.log_tail
    assert "Permission denied" in hqe.log_tail
    assert f"could not reach its own files when it ended: {tmp_path} (mode 0700)" in hqe.log_tail
    # The host is not to blame: cleaned, not repaired; the next run opens the way again.
    world.run_until(lambda: world.host_status(host) == "Ready", what="the host Ready")
    again = world.job('echo hi > "$FLEETSHARD_RESULTS_DIR/out"', meta_host="board:a")
    world.run_until(lambda: world.finished(again), what="the next job")
    assert world.hqe(again).status == "Completed", world.hqe(again).log_tail


# Finding 4: every process of a run is tracked and killed.


def tracked_world(tmp_path: Path, request: pytest.FixtureRequest, mechanism: str, **config) -> ShardWorld:
    tracker = detect(mechanism)
    if tracker.kind != mechanism:
        pytest.skip(f"{mechanism} is not available on this machine")
    world = make_world(tmp_path, request, **config)
    world.scheduler = Scheduler(world.config, LocalExecutor(tracking=mechanism))
    return world


MECHANISMS = [CGROUP_V2, FREEZER, PIDS]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_abort_kills_a_setsid_daemon_and_removes_the_cgroup(tmp_path, db, request, mechanism):
    world = tracked_world(tmp_path, request, mechanism)
    host = world.host("h1", ("board:a",))
    daemon = unique_sleep()
    job = world.job(
        f'setsid {daemon} & echo started > "$FLEETSHARD_RESULTS_DIR/started"; sleep 300', meta_host="board:a"
    )
    world.run_until(lambda: (d := world.results_dir(job)) and Path(d, "started").exists(), what="the job")
    world.run_until(lambda: processes_running(daemon), what="the daemon")
    world.abort(job)
    world.run_until(lambda: world.finished(job), what="the abort")
    assert world.hqe(job).status == "Aborted"
    assert processes_running(daemon) == []
    world.run_until(lambda: world.host_status(host) == "Ready", what="the host Ready")
    tracker = world.scheduler.executor.tracker
    assert not (tracker.root / slug(world.scheduler.runner_id) / f"hqe-{world.hqe(job).id}").exists()


@pytest.mark.parametrize("mechanism", [CGROUP_V2])
def test_timeout_and_a_finished_main_process_leave_no_daemon(tmp_path, db, request, mechanism):
    world = tracked_world(tmp_path, request, mechanism)
    world.host("h1", ("board:a",))
    timed_daemon, left_daemon = unique_sleep(), unique_sleep()
    timed = world.job(f"setsid {timed_daemon} & sleep 300", meta_host="board:a", max_runtime_mins=1, priority=70)
    leaves = world.job(f"setsid {left_daemon} & exit 0", meta_host="board:a")
    world.run_until(lambda: world.finished(timed, leaves) and world.idle(), what="both jobs")
    assert (world.hqe(timed).status, world.hqe(timed).failure) == ("Failed", "timeout")
    assert world.hqe(leaves).status == "Completed"
    assert processes_running(timed_daemon) == [] and processes_running(left_daemon) == []


def test_a_dead_runners_cgroups_are_killed_by_recovery(tmp_path, db, request):
    """A crashed scheduler's runs are found by its runner id alone; a restarted one kills them."""
    world = tracked_world(tmp_path, request, CGROUP_V2)
    daemon = unique_sleep()
    tracker = world.scheduler.executor.tracker
    dead_runner = f"{os.uname().nodename}:999999999:0"
    group = tracker.group(dead_runner, "hqe-1")
    fd = group.join_fd()
    proc = subprocess.Popen(["/bin/sh", "-c", f"setsid {daemon} & sleep 300"], preexec_fn=lambda: os.write(fd, b"0"))  # noqa: PLW1509
    group.started()
    wait_until(lambda: processes_running(daemon), what="the orphan daemon")
    # No HQE or host names that runner: its cgroup alone tells recovery what to kill.
    world.scheduler.recover()
    proc.wait(10)
    assert processes_running(daemon) == []
    assert not group.path.parent.exists()


def test_a_shard_never_reaps_the_runs_under_another_cgroup_name(tmp_path, db, request):
    """Two shards on one machine with their own FLEETSHARD_CGROUP_NAME: a dead runner under the other's
    name is not this shard's to kill (nor are its processes)."""
    world = tracked_world(tmp_path, request, CGROUP_V2)
    other = detect(CGROUP_V2, f"fleetshard-other-{uuid.uuid4().hex[:8]}")
    assert other.root is not None and other.root != world.scheduler.executor.tracker.root
    daemon = unique_sleep()
    group = other.group(f"{os.uname().nodename}:999999999:0", "hqe-1")
    fd = group.join_fd()
    proc = subprocess.Popen(["/bin/sh", "-c", f"setsid {daemon} & sleep 300"], preexec_fn=lambda: os.write(fd, b"0"))  # noqa: PLW1509
    group.started()
    try:
        wait_until(lambda: processes_running(daemon), what="the other shard's daemon")
        world.scheduler.recover()
        assert processes_running(daemon) != [] and proc.poll() is None
    finally:
        other.kill_runner(f"{os.uname().nodename}:999999999:0")
        proc.wait(10)
        remove_cgroup(other.root)
    assert processes_running(daemon) == []


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "x" * 101, "nul\x00"])
def test_a_cgroup_name_that_is_not_one_plain_directory_name_is_refused(name):
    with pytest.raises(ValueError, match="FLEETSHARD_CGROUP_NAME must be one directory name"):
        detect(CGROUP_V2, name)


# Finding 5: bounds.


def test_a_log_is_cut_at_the_cap_and_the_job_runs_to_its_end(tmp_path, db, request):
    world = make_world(tmp_path, request, max_log_bytes=1000)
    world.host("h1", ("board:a",))
    job = world.job(
        "head -c 300000 /dev/zero | tr '\\0' x; echo; echo reached-the-end >&2; exit 0", meta_host="board:a"
    )
    world.run_until(lambda: world.finished(job), what="the job")
    hqe = world.hqe(job)
    log = Path(hqe.run.results_dir, "job.log").read_text()
    assert hqe.status == "Completed"
    assert log.startswith("x" * 1000) and "log cut at 1000 bytes" in log
    assert len(log) < 1200 and "reached-the-end" not in log
    assert "log cut at 1000 bytes" in hqe.log_tail


def age(path: Path, days: float) -> None:
    then = time.time() - days * 86400
    os.utime(path, (then, then))


def test_old_run_directories_are_removed_but_never_an_active_runs(tmp_path, db, request):
    world = make_world(tmp_path, request, retention_days=1)
    root = world.config.results_root
    old, fresh, active = root / "7" / "1-h1", root / "7" / "2-h1", root / "8" / "3-h2"
    old_host = root / "hosts" / "h1" / "cleanup-20260101T000000"
    for path in (old, fresh, active, old_host):
        path.mkdir(parents=True)
        (path / "job.log").write_text("output")
    for path in (old, active, old_host):
        age(path / "job.log", 3)
        age(path, 3)
    assert remove_old_results(root, time.time() - 86400, {str(active)}) == 2
    assert not old.exists() and not old_host.exists()
    assert fresh.exists() and active.exists()
    # The scheduler does the same from its loop, once an interval, and knows the active runs itself.
    host = world.host("h2", ("board:a",), locked=True)
    job = world.job("true", meta_host="board:a")
    with shard_write():
        transition_hqe(world.hqe(job).id, "Running", host_id=host)
        # Run by a scheduler process on another machine: alive as far as this one can tell.
        open_run(world.hqe(job).id, "elsewhere:1:1")
        record_run(world.hqe(job).id, results_dir=str(active))
    age(fresh / "job.log", 3)
    age(fresh, 3)
    world.scheduler.tick()
    assert not fresh.exists() and active.exists()


# Finding 6: the N HQEs of LABEL*N run on N different hosts.


def test_a_meta_host_job_never_uses_one_host_twice_even_across_a_restart(world):
    first = world.host("h1", ("board:a",))
    job = world.job("true", meta_host="board:a", count=3)
    world.run_until(lambda: any(h.status == "Completed" for h in world.hqes(job)) and world.idle(), what="one HQE")
    for _ in range(10):
        world.scheduler.tick()
    assert sorted(h.status for h in world.hqes(job)) == ["Completed", "Queued", "Queued"]
    # A restarted scheduler knows from the database which host the job already used.
    world.scheduler = Scheduler(world.config)
    for _ in range(10):
        world.scheduler.tick()
    assert sorted(h.status for h in world.hqes(job)) == ["Completed", "Queued", "Queued"]
    world.host("h2", ("board:a",))
    world.host("h3", ("board:a",))
    world.run_until(lambda: world.finished(job), what="the other two HQEs")
    hosts = [h.host_id for h in world.hqes(job)]
    assert all(h.status == "Completed" for h in world.hqes(job))
    assert len(set(hosts)) == 3 and first in hosts


def test_the_limits_and_the_job_environment_come_from_settings(settings, tmp_path, db, request):
    settings.FLEETSHARD_MAX_LOG_BYTES = 500
    settings.FLEETSHARD_RESULTS_RETENTION_DAYS = 0.5
    settings.FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS = 2
    settings.FLEETSHARD_JOB_ENV_PASSTHROUGH = "TOOLCHAIN, EXTRA ,FLEETSHARD_SHARD_TOKEN,DATABASE_URL"
    settings.FLEETSHARD_JOB_USER = "root"
    settings.FLEETSHARD_RESULTS_DIR = tmp_path / "results"
    config = SchedulerConfig.from_settings()
    assert (config.max_log_bytes, config.retention_days, config.upload_horizon_days) == (500, 0.5, 2.5)
    assert config.env_passthrough == ("TOOLCHAIN", "EXTRA")
    assert config.job_user is None
    world = make_world(tmp_path, request)
    world.scheduler = Scheduler(replace(config, tick_s=0.05))
    world.host("h1", ("board:a",))
    job = world.job("yes | head -c 5000", meta_host="board:a")
    world.run_until(lambda: world.finished(job), what="the job")
    assert "log cut at 500 bytes" in world.hqe(job).log_tail


HIDING_PARENT = """
import ctypes, ctypes.util, os, pwd, subprocess, sys
from shard.run.isolation import hide_environ
# Imported as root (the checkout may be closed to nobody, as a 0700 temp dir is), then run as nobody,
# dumpable again as a process started as nobody would be (changing uid clears the flag).
nobody = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)
ctypes.CDLL(ctypes.util.find_library("c")).prctl(4, 1, 0, 0, 0)
if sys.argv[1] == "hide":
    assert hide_environ()
child = subprocess.run(["/bin/sh", "-c", "cat /proc/$PPID/environ"], capture_output=True)
print("SECRET_SEEN" if b"PARENT_SECRET=p-51" in child.stdout else "nothing")
"""


@as_root
@pytest.mark.parametrize(("mode", "expected"), [("hide", "nothing"), ("show", "SECRET_SEEN")])
def test_a_shard_of_the_jobs_own_user_hides_its_environment_from_them(mode, expected):
    """As a shard running jobs as its own user does: both sides are `nobody` here."""
    env = {"PATH": "/usr/bin:/bin", "PARENT_SECRET": "p-51", "PYTHONPATH": str(ROOT)}
    parent = subprocess.run(
        [sys.executable, "-c", HIDING_PARENT, mode], env=env, capture_output=True, text=True, cwd="/"
    )
    assert parent.stdout.strip() == expected, parent.stderr


def test_a_run_directory_dated_in_the_future_by_its_job_is_still_removed(tmp_path):
    """A job may `touch -d 2099-01-01` its directory and files: an mtime in the future used to keep
    the run forever past the retention. A change time cannot be set, and a later mtime than it is a lie."""
    root = tmp_path / "results"
    run = root / "7" / "1-h1"
    run.mkdir(parents=True)
    (run / "job.log").write_text("output")
    (run / "cleanup.log").write_text("mine")
    future = time.time() + 80 * 365 * 86400
    for path in (run / "job.log", run / "cleanup.log", run):
        os.utime(path, (future, future))
    assert remove_old_results(root, time.time() + 60, set()) == 1
    assert not run.exists()


@as_root
def test_a_job_cannot_read_or_change_what_an_earlier_job_left(tmp_path, db, request):
    """Every job runs as the one job user: an ended run's directory stayed that user's, so any later
    job could read another's results (or move its log away) by the predictable path."""
    user = resolve_job_user("nobody")
    assert user is not None
    world = make_world(tmp_path, request, job_user=user)
    make_traversable(world.config.results_root, user)
    world.host("h1", ("board:a",))
    first = world.job('echo topsecret > "$FLEETSHARD_RESULTS_DIR/secret"', meta_host="board:a")
    world.run_until(lambda: world.finished(first), what="the first job")
    done = Path(world.results_dir(first))
    later = world.job(
        f"cat {done}/secret || echo cannot-read; mv {done}/job.log {done}/gone || echo cannot-move",
        meta_host="board:a",
    )
    world.run_until(lambda: world.finished(later), what="the later job")
    tail = world.hqe(later).log_tail
    assert "topsecret" not in tail
    assert {"cannot-read", "cannot-move"} <= set(tail.splitlines())
    assert (done / "secret").read_text() == "topsecret\n" and (done / "job.log").exists()
