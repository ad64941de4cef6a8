"""Executors run a job's command (or a host's cleanup and repair command) somewhere and report its end.

The scheduler only sees `Executor` and `RunHandle`, so another kind of executor (SSH, ADB, a batch
system) is a new subclass here and a setting, with no change to the scheduler.
"""

import contextlib
import os
import re
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from common.constants import LOG_TAIL_BYTES

# The shard's own secrets and database never reach a job's environment.
_HIDDEN_ENV = re.compile(r"^(FLEETSHARD_.*|DATABASE_URL|SECRET_KEY)$")


@dataclass(frozen=True)
class RunSpec:
    """What to run: a shell command in a working directory, its output to `log_path`."""

    command: str
    workdir: Path
    log_path: Path
    env: dict[str, str]


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


class Executor(ABC):  # noqa: B024 (kill_orphan is optional: not every kind leaves orphans)
    @abstractmethod
    def start(self, spec: RunSpec) -> RunHandle:
        """Starts the run; raises OSError (or a subclass's error) when it cannot."""

    def kill_orphan(self, pid: int, hqe_id: int) -> None:  # noqa: B027
        """Kills what a crashed shard left of HQE `hqe_id`'s run (`pid` as recorded), if anything."""


def env_name(text: str) -> str:
    """`board.serial-no` -> `BOARD_SERIAL_NO`: a key as it may appear in an environment variable name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text).upper()


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not _HIDDEN_ENV.match(k)}


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, decoded leniently; '' when there is no log."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group. Zombies count as gone: only a reaper can clear them."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its closing one.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


class LocalRun(RunHandle):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal_all(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def lingering(self) -> bool:
        return self.proc.poll() is None or bool(group_members(self.proc.pid))


class LocalExecutor(Executor):
    """Runs `/bin/sh -c COMMAND` on this machine in a new session, so its process group is its own."""

    def start(self, spec: RunSpec) -> RunHandle:
        with open(spec.log_path, "ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", spec.command],
                cwd=spec.workdir,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        return LocalRun(proc)

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
