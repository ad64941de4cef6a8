"""The worker backends against real processes: a local worker is counted from the moment it can run."""

import errno
from pathlib import Path

import pytest

from shard.elastic import backends
from shard.elastic.backends import BackendError, LocalBackend, SlurmBackend, SlurmOptions, WorkerSpec
from tests.support import wait_until


def local(tmp_path: Path, script: str) -> LocalBackend:
    command = ("/bin/sh", "-c", script)
    return LocalBackend(WorkerSpec("pool-test", command, cwd=tmp_path, log_dir=tmp_path / "workers"))


def test_a_local_worker_is_listed_while_it_runs_and_stop_sends_it_sigterm(tmp_path):
    backend = local(tmp_path, "trap 'echo drained > drained; exit 0' TERM; touch started; while :; do sleep 0.05; done")
    worker = backend.start()
    assert [w.id for w in backend.list_workers()] == [worker]
    wait_until(lambda: (tmp_path / "started").exists(), timeout=10, interval=0.02, what="the worker to start")
    backend.stop(worker)
    (child,) = backend._children
    assert child.wait(timeout=10) == 0
    assert (tmp_path / "drained").read_text() == "drained\n"
    assert backend.list_workers() == []
    assert list((tmp_path / "workers").glob("*.pid")) == []


def test_a_manager_killed_before_it_recorded_a_local_worker_leaves_no_uncounted_worker_running(tmp_path, monkeypatch):
    backend = local(tmp_path, "touch ran")

    def killed(pid: int) -> list[str]:
        raise KeyboardInterrupt("the manager dies between starting the worker and writing its pid file")

    monkeypatch.setattr(backends, "proc_stat", killed)
    with pytest.raises(KeyboardInterrupt):
        backend.start()
    (child,) = backend._children
    child.wait(timeout=10)
    assert not (tmp_path / "ran").exists(), "a worker nobody counts ran: the pool could exceed --max-workers"


def test_a_local_worker_that_cannot_start_is_a_backend_error(tmp_path):
    backend = LocalBackend(
        WorkerSpec("pool-test", (str(tmp_path / "missing"),), cwd=tmp_path / "nowhere", log_dir=tmp_path / "w")
    )
    with pytest.raises(BackendError):
        backend.start()
    assert backend.list_workers() == []


def test_an_operators_sbatch_option_cannot_rename_or_redirect_the_workers_even_abbreviated(tmp_path):
    """sbatch takes the last of repeated options and any unambiguous prefix of a long one (`--job=x` is
    `--job-name=x`): a worker renamed so would be invisible to the manager, which would start more."""
    spec = WorkerSpec("fleetshard-lab1-abc", ("run_shard",), cwd=tmp_path, log_dir=tmp_path / "w")
    options = SlurmOptions(sbatch_options=("--job=other", "--out=/tmp/x", "--chd=/", "--qos=low"))
    argv = SlurmBackend(spec, options).sbatch_argv()
    assert argv[-7:] == [
        "--job-name=fleetshard-lab1-abc",
        f"--chdir={tmp_path}",
        f"--output={tmp_path / 'w'}/worker-%j.log",
        "--export=ALL",
        "--parsable",
        "--wrap",
        "exec run_shard",
    ]
    assert argv.index("--qos=low") < argv.index("--job-name=fleetshard-lab1-abc")


def test_a_local_worker_whose_proc_entry_cannot_be_read_is_not_forgotten(tmp_path, monkeypatch):
    """Out of file descriptors, /proc cannot be read: that says nothing of the worker, whose pid file
    must stay (dropped, the worker would run on uncounted and the manager would start more)."""
    backend = local(tmp_path, "while :; do sleep 0.05; done")
    worker = backend.start()
    real = backends.proc_stat

    def no_descriptors(pid: int | str, *, gone_only: bool = False) -> list[str]:
        # What shard.run.tracking.proc_stat does when open() fails with EMFILE.
        if gone_only:
            raise OSError(errno.EMFILE, "Too many open files")
        return []

    try:
        monkeypatch.setattr(backends, "proc_stat", no_descriptors)
        with pytest.raises(BackendError):
            backend.list_workers()
        monkeypatch.setattr(backends, "proc_stat", real)
        assert [w.id for w in backend.list_workers()] == [worker]
    finally:
        (child,) = backend._children
        child.kill()
        child.wait(timeout=10)
