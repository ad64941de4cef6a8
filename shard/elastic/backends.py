"""Where elastic workers run: a `Backend` lists the pool's workers with their state, starts one, stops one.

The backend's list is the truth (docs/design.md, "Elastic workers"): the manager keeps no count of its own,
so a manager restarted finds its workers again. Each backend finds its own by the pool's name
(a Slurm job name, a directory of pid files), which says which shard and which labels they serve.
"""

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shard.elastic.policy import Worker, WorkerState
from shard.run.tracking import proc_stat

log = logging.getLogger(__name__)

# Bounds on what a batch system's tools may print back to us.
MAX_TOOL_OUTPUT = 1024 * 1024
TOOL_TIMEOUT_S = 30.0
# A local worker runs its command only once told to by the manager, after its pid file is written.
GATE = 'read -r go && [ "$go" = go ] && exec "$@" </dev/null'
# The same, passing the worker its id: the shell's pid, which exec keeps (the id the backend lists).
GATE_WITH_ID = 'read -r go && [ "$go" = go ] && exec "$@" "--worker-id=$$" </dev/null'


class BackendError(Exception):
    """The backend could not list, start or stop workers this time; the next tick tries again."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a pool runs, and where: `command` in `cwd`, with the manager's environment."""

    pool: str
    command: tuple[str, ...]
    cwd: Path
    log_dir: Path
    # Whether the command takes `--worker-id=ID` (a run_shard worker): the backend's id of the worker
    # (a local worker's pid, a Slurm job id) is passed, so its hosts are named after it.
    worker_id: bool = False


class Backend(ABC):
    name = ""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    @abstractmethod
    def list_workers(self) -> list[Worker]:
        """The pool's workers now, pending or active; raises BackendError when it cannot tell."""

    @abstractmethod
    def start(self) -> str:
        """Starts one worker and returns its id; raises BackendError."""

    @abstractmethod
    def stop(self, worker_id: str) -> None:
        """Stops a worker that has not started running yet (one that already runs is left alone)."""


class LocalBackend(Backend):
    """Workers are `run_shard` processes on this machine, each recorded by a pid file in the pool's
    directory (pid and start time, so a reused pid is never taken for a worker). They run in sessions
    of their own: a stopped or restarted manager leaves them running, and finds them again."""

    name = "local"

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.dir = spec.log_dir
        # Only to reap the workers this process started once they exit: never counted.
        self._children: list[subprocess.Popen[bytes]] = []

    def list_workers(self) -> list[Worker]:
        self._children = [c for c in self._children if c.poll() is None]
        workers = []
        try:
            pid_files = sorted(self.dir.glob("*.pid"))
        except OSError as exc:
            raise BackendError(f"cannot read {self.dir}: {exc}") from exc
        for path in pid_files:
            pid = _live_pid(path)
            if pid is None:
                path.unlink(missing_ok=True)
                continue
            try:
                order = path.stat().st_mtime
            except OSError:
                order = 0.0
            workers.append(Worker(str(pid), WorkerState.ACTIVE, order=order))
        return workers

    def start(self) -> str:
        """Starts a worker that waits for its pid file: a manager killed before writing it (which would
        leave a worker nobody counts) closes the worker's stdin first, and the worker exits unrun."""
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"worker-{time.time_ns()}"
        try:
            with open(self.dir / f"{name}.log", "wb") as out:
                child = subprocess.Popen(
                    (
                        "/bin/sh",
                        "-c",
                        GATE_WITH_ID if self.spec.worker_id else GATE,
                        "fleetshard-worker",
                        *self.spec.command,
                    ),
                    cwd=self.spec.cwd,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "FLEETSHARD_WORKER_NAME": name},
                )
        except OSError as exc:
            raise BackendError(f"cannot start {self.spec.command[0]}: {exc}") from exc
        self._children.append(child)
        assert child.stdin is not None
        try:
            # exec keeps the process's start time: the pid file names the worker it becomes.
            fields = proc_stat(child.pid)
            start = fields[19] if len(fields) > 19 else ""
            tmp = self.dir / f"{name}.tmp"
            tmp.write_text(f"{child.pid} {start}\n")
            tmp.rename(self.dir / f"{name}.pid")
            child.stdin.write(b"go\n")
        except OSError as exc:
            raise BackendError(f"cannot record worker {child.pid}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                child.stdin.close()
        return str(child.pid)

    def stop(self, worker_id: str) -> None:
        for path in self.dir.glob("*.pid"):
            if str(_live_pid(path)) == worker_id:
                os.kill(int(worker_id), signal.SIGTERM)  # drains: its runs get FLEETSHARD_DRAIN_S


def _live_pid(path: Path) -> int | None:
    """The pid a worker's pid file names, when that very process (not a reuse of its pid) still runs.

    Raises BackendError when it cannot tell (no file descriptors left): a worker whose pid file were
    dropped then would run on uncounted."""
    try:
        text = path.read_text()[:100]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackendError(f"cannot read {path}: {exc}") from exc
    try:
        pid_text, start = text.split()
        pid = int(pid_text)
    except ValueError:
        return None
    try:
        fields = proc_stat(pid, gone_only=True)
    except OSError as exc:
        raise BackendError(f"cannot tell whether worker {pid} runs: {exc}") from exc
    if len(fields) <= 19 or fields[0] == "Z" or fields[19] != start:
        return None
    return pid


@dataclass(frozen=True)
class SlurmOptions:
    partition: str = ""
    account: str = ""
    time_limit: str = ""
    sbatch_options: tuple[str, ...] = field(default_factory=tuple)


class SlurmBackend(Backend):
    """Workers are Slurm batch jobs named for the pool (`sbatch --parsable`, `squeue`, `scancel`).

    A job Slurm has not started yet is pending; any other state it lists (running, completing...) is
    active. Stopping cancels a job only while Slurm still has it pending (`scancel --state=PENDING`),
    so a worker that began running between the list and the stop is never killed.
    """

    name = "slurm"

    def __init__(self, spec: WorkerSpec, options: SlurmOptions) -> None:
        super().__init__(spec)
        self.options = options
        self.job_name = spec.pool  # shard.elastic.manager.pool_key: letters, digits, ".", "_" and "-"

    def _run(self, argv: Sequence[str]) -> str:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{argv[0]}: {exc}") from exc
        out = done.stdout[:MAX_TOOL_OUTPUT].decode(errors="replace")
        if done.returncode != 0:
            err = done.stderr[:2000].decode(errors="replace").strip()
            raise BackendError(f"{argv[0]} exited {done.returncode}: {err or out[:2000]}")
        return out

    def list_workers(self) -> list[Worker]:
        out = self._run(["squeue", "--noheader", f"--name={self.job_name}", "--format=%i %T", "--me"])
        workers = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) != 2 or not parts[0].isdigit():
                log.warning("squeue printed a line that is no job: %r", line[:200])
                continue
            job_id, state = parts
            kind = WorkerState.PENDING if state == "PENDING" else WorkerState.ACTIVE
            workers.append(Worker(job_id, kind, order=float(job_id)))
        return workers

    def sbatch_argv(self) -> list[str]:
        """The operator's options first, the manager's after: sbatch takes the last of a repeated option
        and any prefix of a long one (`--job=x`), so no option can rename the workers out of sight."""
        argv = ["sbatch"]
        if self.options.partition:
            argv.append(f"--partition={self.options.partition}")
        if self.options.account:
            argv.append(f"--account={self.options.account}")
        if self.options.time_limit:
            argv.append(f"--time={self.options.time_limit}")
        argv += self.options.sbatch_options
        argv += [
            f"--job-name={self.job_name}",
            f"--chdir={self.spec.cwd}",
            f"--output={self.spec.log_dir}/worker-%j.log",
            "--export=ALL",
            "--parsable",
        ]
        wrapped = "exec " + shlex.join(self.spec.command)
        if self.spec.worker_id:
            wrapped += ' "--worker-id=$SLURM_JOB_ID"'
        argv += ["--wrap", wrapped]
        return argv

    def start(self) -> str:
        self.spec.log_dir.mkdir(parents=True, exist_ok=True)
        out = self._run(self.sbatch_argv()).strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id: {out[:200]!r}")
        return job_id

    def stop(self, worker_id: str) -> None:
        if not worker_id.isdigit():
            raise BackendError(f"not a Slurm job id: {worker_id[:50]!r}")
        self._run(["scancel", "--state=PENDING", f"--name={self.job_name}", "--me", worker_id])


BACKENDS = ("local", "slurm", "kubernetes")
NOT_BUILT = {
    "kubernetes": "the kubernetes backend is not built yet: no Kubernetes server can be tested here "
    "(use --backend local or slurm)"
}
