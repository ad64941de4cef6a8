"""Executors run a job's command (or a host's cleanup and repair command) somewhere and report its end.

The scheduler only sees `Executor` and `RunHandle`, so another kind of executor (SSH, ADB, a batch
system) is a new subclass here and a setting, with no change to the scheduler.

The local executor treats the job as untrusted: it runs as the job user (shard/run/isolation.py), in
its own cgroup (shard/run/tracking.py), and writes its output through a pipe that the shard copies to
the log, so a log never grows past FLEETSHARD_MAX_LOG_BYTES however fast a job prints. The shard
keeps its own descriptor of the log: the job owns its results directory and may replace `job.log`
with a link to a secret, but the shard only reads and appends through what it opened itself.
"""

import contextlib
import os
import signal
import stat
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from common.constants import DEFAULT_MAX_LOG_BYTES, LOG_TAIL_BYTES
from common.wire import clean_text
from shard.run import open_logs
from shard.run.isolation import JobUser, take_back
from shard.run.tracking import PROCESS_GROUP, TOP, Cgroup, Group, Tracker, detect, group_members

COPY_CHUNK = 64 * 1024
# uid:gid of the job user, for the A/B driver (RunSpec.driver).
DRIVER_USER_ENV = "FLEETSHARD_AB_USER"


@dataclass(frozen=True)
class RunSpec:
    """What to run: a shell command in a working directory, its output to `log_path`.

    `user` is who runs it (None: the shard's own user); `runner` and `name` name its cgroup, so a
    restarted shard finds what a crashed one left; the log keeps at most `max_log_bytes` of output.
    """

    command: str
    workdir: Path
    log_path: Path
    env: dict[str, str]
    user: JobUser | None = None
    runner: str = ""
    name: str = ""
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    # The command is fleetshard's own A/B driver (shard/run/abrun.py): it runs as the shard's user, reads
    # `user` from its environment and runs each of the job's runs as that user.
    driver: bool = False


class RunHandle(ABC):
    """One started run. Every method returns at once; the scheduler polls."""

    pid: int | None

    @abstractmethod
    def poll(self) -> int | None:
        """The run's exit status once its main process has ended (128+N for signal N), else None."""

    @abstractmethod
    def signal_all(self, signum: int) -> None:
        """Sends `signum` to every process of the run, the main one's children included."""

    @abstractmethod
    def lingering(self) -> bool:
        """True while any process of the run is still alive (a run ends only when this is False)."""

    def note(self, text: str) -> bool:  # noqa: B027 (optional: the scheduler falls back to the log's path)
        """Adds a line of the shard's own to the run's log; False when this kind cannot."""
        return False

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str | None:
        """The end of the run's log, cleaned for the wire; None when this kind cannot tell."""
        return None

    def close(self) -> None:  # noqa: B027
        """Releases what the run held once it has ended (its log, its cgroup)."""


class Executor(ABC):  # noqa: B024 (kill_orphan is optional: not every kind leaves orphans)
    @abstractmethod
    def start(self, spec: RunSpec) -> RunHandle:
        """Starts the run; raises OSError (or a subclass's error) when it cannot."""

    def kill_orphan(self, pid: int, hqe_id: int) -> None:  # noqa: B027
        """Kills what a crashed shard left of HQE `hqe_id`'s run (`pid` as recorded), if anything."""

    def kill_runner(self, runner: str) -> None:  # noqa: B027
        """Kills everything a dead scheduler process `runner` left running on this machine."""

    def runners(self) -> list[str]:
        """Scheduler processes that left something here to kill (even with no HQE or host to show for it)."""
        return []

    def describe(self) -> str:
        """How runs are kept apart, for the start log."""
        return type(self).__name__


class UnsafeFile(OSError):
    """A file a job could have planted: a link, a device or pipe, a hard link, someone else's file."""


def open_regular(path: Path | str, flags: int, owners: Collection[int], dir_fd: int | None = None) -> int:
    """Opens a regular file of one of `owners` without following a link: a job owns the directories it
    writes in and may put anything under a name the shard opens. Raises OSError (UnsafeFile: refused)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    info = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file"
    elif info.st_nlink != 1:
        problem = f"a hard link ({info.st_nlink} names)"
    elif info.st_uid not in owners:
        problem = f"owned by uid {info.st_uid}"
    if problem:
        os.close(fd)
        raise UnsafeFile(problem)
    return fd


def _open_own_log(path: Path, flags: int) -> int | None:
    """Opens a log the shard wrote, refusing what a job may have put in its place (a link, its own file)."""
    try:
        return open_regular(path, flags, (os.geteuid(),))
    except OSError:
        return None


def _tail_of(fd: int, limit: int) -> str:
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    return clean_text(os.pread(fd, size - start, start).decode("utf-8", errors="replace"))


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, decoded leniently and cleaned for the wire; '' when there is none."""
    fd = _open_own_log(path, os.O_RDONLY)
    if fd is None:
        return ""
    try:
        return _tail_of(fd, limit)
    finally:
        os.close(fd)


def append_note(path: Path, text: str) -> None:
    fd = _open_own_log(path, os.O_WRONLY | os.O_APPEND)
    if fd is not None:
        try:
            os.write(fd, f"\n[fleetshard] {text}\n".encode())
        finally:
            os.close(fd)


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


class LogCopier(threading.Thread):
    """Copies a run's output from its pipe to the log, up to a cap; the rest is read and dropped.

    Reading on past the cap keeps the job from blocking on a full pipe, so a chatty job runs as it
    would have; the log says where it was cut.
    """

    def __init__(self, read_fd: int, log_fd: int, cap: int, name: str) -> None:
        super().__init__(name=f"log-{name}", daemon=True)
        self.read_fd = read_fd
        self.log_fd = log_fd
        self.cap = cap
        self.written = 0
        self.cut = False
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while chunk := os.read(self.read_fd, COPY_CHUNK):
                self._keep(chunk)
        except OSError:
            pass
        finally:
            os.close(self.read_fd)

    def _keep(self, chunk: bytes) -> None:
        room = self.cap - self.written
        with self.lock:
            if room > 0:
                part = chunk[:room]
                os.write(self.log_fd, part)
                self.written += len(part)
            if len(chunk) > room and not self.cut:
                self.cut = True
                os.write(self.log_fd, f"\n[fleetshard] log cut at {self.cap} bytes: the rest was dropped\n".encode())

    def note(self, text: str) -> None:
        with self.lock:
            os.write(self.log_fd, f"\n[fleetshard] {text}\n".encode())


class LocalRun(RunHandle):
    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        group: Group,
        copier: LogCopier,
        log_fd: int,
        workdir: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.proc = proc
        self.log_path = log_path
        # Given back to the shard once the run has ended (a job user's directory only).
        self.workdir = workdir
        self.pid = proc.pid
        self.group = group
        self.copier = copier
        self.log_fd = log_fd
        self.closed = False

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal_all(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.group.kill(self.proc.pid)
        else:
            self.group.signal(signum, self.proc.pid)
        # The main process and its group too, whatever the group's kind: they are the run's first.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def lingering(self) -> bool:
        return self.proc.poll() is None or bool(self.group.pids(self.proc.pid))

    def note(self, text: str) -> bool:
        if self.closed:
            return False
        self.copier.note(text)
        return True

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str | None:
        if self.closed:
            return None
        # The output still in the pipe belongs in the tail: every writer is gone once the run ended.
        self.copier.join(timeout=5)
        return _tail_of(self.log_fd, limit)

    def close(self) -> None:
        if self.closed:
            return
        self.copier.join(timeout=5)
        if not self.copier.is_alive():
            if self.log_path is not None:
                open_logs.forget(self.log_path)
            os.close(self.log_fd)
            self.closed = True
        self.group.remove()
        if self.workdir is not None:
            take_back(self.workdir)
            self.workdir = None


class LocalExecutor(Executor):
    """Runs `/bin/sh -c COMMAND` on this machine: new session, own cgroup, the job user, a capped log."""

    def __init__(self, tracking: str | None = None) -> None:
        self._tracking = tracking
        self._tracker: Tracker | None = None

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            from django.conf import settings

            self._tracker = detect(
                self._tracking or str(getattr(settings, "FLEETSHARD_PROCESS_TRACKING", "auto")),
                str(getattr(settings, "FLEETSHARD_CGROUP_NAME", TOP)),
            )
        return self._tracker

    def describe(self) -> str:
        return self.tracker.describe()

    def start(self, spec: RunSpec) -> RunHandle:
        log_fd = os.open(spec.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        group: Group | None = None
        read_fd = write_fd = -1
        try:
            group = self.tracker.group(spec.runner, spec.name)
            read_fd, write_fd = os.pipe()
            proc = self._popen(spec, group, write_fd)
        except BaseException:
            for fd in (log_fd, read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            if group is not None:
                group.remove()
            raise
        os.close(write_fd)
        if isinstance(group, Cgroup):
            group.started()
        copier = LogCopier(read_fd, log_fd, spec.max_log_bytes, spec.name or str(proc.pid))
        copier.start()
        open_logs.remember(spec.log_path, log_fd)
        return LocalRun(proc, group, copier, log_fd, spec.workdir if spec.user is not None else None, spec.log_path)

    @staticmethod
    def _popen(spec: RunSpec, group: Group, stdout_fd: int) -> subprocess.Popen[bytes]:
        join_fd = group.join_fd()

        def join() -> None:
            # Runs in the child before exec (after it took the job user; the fd was opened by the
            # shard): everything the job starts is born in its cgroup.
            if join_fd is not None:
                os.write(join_fd, b"0")

        user = None if spec.driver else spec.user
        env = spec.env
        if spec.driver and spec.user is not None:
            env = {**env, DRIVER_USER_ENV: f"{spec.user.uid}:{spec.user.gid}"}
        return subprocess.Popen(
            ["/bin/sh", "-c", spec.command],
            cwd=spec.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=join if join_fd is not None else None,  # noqa: PLW1509
            user=user.uid if user is not None else None,
            group=user.gid if user is not None else None,
            extra_groups=[] if user is not None else None,
        )

    def runners(self) -> list[str]:
        return self.tracker.runners()

    def kill_runner(self, runner: str) -> None:
        if self.tracker.kind != PROCESS_GROUP:
            self.tracker.kill_runner(runner)

    def kill_orphan(self, pid: int, hqe_id: int) -> None:
        """Kills the orphaned group, but only processes that carry the HQE's id: the pid may be reused."""
        marker = f"FLEETSHARD_HQE_ID={hqe_id}".encode()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            members = [m for m in group_members(pid) if _environ_has(m, marker)]
            if not members:
                return
            for member in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
            time.sleep(0.05)
