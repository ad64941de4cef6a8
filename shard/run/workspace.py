"""Where a run lives and what it sees: its results directory, its log, its environment.

A job's directory is `RESULTS_ROOT/JOB/HQE-HOST` and a host command's `RESULTS_ROOT/hosts/HOST/KIND-TIME`;
each holds the command's log (`job.log`, `cleanup.log`, `repair.log`). A job's result files are its
`results/*.json`; once the run ended the shard moves each to `archive/` or `quarantine/` beside it
(shard/uploads/results.py). A job's environment is an
allowlist from the shard's plus the FLEETSHARD_* variables below, never the shard's own secrets.
"""

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from common.models import Host, Job
from shard.run.executor import read_tail
from shard.run.isolation import JobUser, inherited_env

# The log a run's command writes in its results directory; a host command's is `KIND.log`.
RUN_LOG = "job.log"
# A run's result files (written by the job) and where the shard moves each once it is handled.
RESULTS = "results"
ARCHIVE = "archive"
QUARANTINE = "quarantine"
RESULT_SUFFIX = ".json"
# A job's own Chrome trace, beside results/: uploaded for the master's timeline (master.timeline.jobtrace).
TRACE = "trace.json"
HOSTS_DIR = "hosts"

log = logging.getLogger(__name__)


class BadHost(ValueError):
    """A host's config from the master cannot be used (its attributes are not an object, say)."""


def attributes_of(host: Host) -> dict[str, Any]:
    """The host's attributes; the master's config is checked here, where a wrong shape would otherwise crash."""
    attributes = host.attributes or {}
    if not isinstance(attributes, dict):
        raise BadHost(f"host {host.hostname}: attributes must be a JSON object, not {type(attributes).__name__}")
    return attributes


def env_name(text: str) -> str:
    """`board.serial-no` -> `BOARD_SERIAL_NO`: a key as it may appear in an environment variable name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text).upper()


def host_env(host: Host) -> dict[str, str]:
    env = {"FLEETSHARD_HOSTNAME": host.hostname}
    for key, value in attributes_of(host).items():
        env[f"FLEETSHARD_HOST_ATTR_{env_name(key)}"] = str(value)
    return env


def command_env(host: Host, results_dir: Path, passthrough: tuple[str, ...] = ()) -> dict[str, str]:
    """What every command on a host sees (a host command sees no more): its host and its own directory."""
    env = inherited_env(passthrough) | host_env(host)
    env |= {"FLEETSHARD_RESULTS_DIR": str(results_dir), "HOME": str(results_dir)}
    return env


def job_env(job: Job, hqe_id: int, host: Host, results_dir: Path, passthrough: tuple[str, ...] = ()) -> dict[str, str]:
    """The whole environment of a run: the command's, then the job's ids and keyvals (docs/protocol.md)."""
    env = command_env(host, results_dir, passthrough)
    env.update(FLEETSHARD_JOB_ID=str(job.id), FLEETSHARD_HQE_ID=str(hqe_id))
    for keyvals in (job.suite_keyvals or {}, job.keyvals or {}):
        for key, value in keyvals.items():
            env[f"FLEETSHARD_KEYVAL_{env_name(key)}"] = str(value)
    return env


def safe_name(text: str) -> str:
    """A hostname as one path component: a name from the master must never climb out of the results root."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"


def fresh_dir(parent: Path, name: str) -> Path:
    """A new directory `parent/name` (or `name-2`, `name-3`...): results are never mixed or overwritten.

    `parent` is made traversable but not listable (0711): a job reaches its own directory by name
    and never sees its neighbours'.
    """
    parent.mkdir(parents=True, exist_ok=True)
    if parent.stat().st_mode & 0o777 != 0o711:
        parent.chmod(0o711)
    for n in range(1, 10_000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise OSError(f"cannot make a fresh directory for {name} under {parent}")


def run_dir(root: Path, job_id: int, hqe_id: int, hostname: str) -> Path:
    return fresh_dir(root / str(job_id), f"{hqe_id}-{safe_name(hostname)}")


def make_results_folder(run: Path, user: JobUser | None) -> Path:
    """`RUN/results/`, ready before the job starts: a job writing `$FLEETSHARD_RESULTS_DIR/results/x.json`
    must not fail on a missing folder. It is the job user's, as the run's directory is."""
    folder = run / RESULTS
    folder.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        os.chown(folder, user.uid, user.gid)
    return folder


def host_command_dir(root: Path, hostname: str, kind: str, stamp: str) -> Path:
    return fresh_dir(root / HOSTS_DIR / safe_name(hostname), f"{kind}-{stamp}")


def run_log_tail(results_dir: str) -> str:
    """The last bytes of a run's log as they are now: a running HQE stores its tail only when it ends."""
    return read_tail(Path(results_dir) / RUN_LOG) if results_dir else ""


def remove_old_results(root: Path, cutoff: float, active: set[str], pending_cutoff: float | None = None) -> int:
    """Removes `root/GROUP/RUN` directories last changed before `cutoff`, then emptied groups.

    A job's run whose result files still wait in `results/` (the master was out of reach) is kept
    until `pending_cutoff`: past that the master is not coming back for them (a shard struck off it),
    and a job that plants files there to keep its directory keeps it no longer. Host command
    directories (`root/hosts/HOST/KIND-TIME`) are old results like any other; a host command still
    running keeps changing its directory's log, so it is never that old.
    """
    removed = waiting = 0
    run_groups = [g for g in _subdirs(root) if g.name != HOSTS_DIR]
    host_groups = _subdirs(root / HOSTS_DIR)
    for group in run_groups + host_groups:
        for directory in _subdirs(group):
            if str(directory) in active:
                continue
            changed = _newest_change(directory)
            if changed >= cutoff:
                continue
            waits = pending_cutoff is not None and changed >= pending_cutoff and group not in host_groups
            if waits and has_pending_results(directory):
                waiting += 1
                continue
            shutil.rmtree(directory, ignore_errors=True)
            removed += not directory.exists()
        # An empty group is left alone while young: another scheduler may be about to make a run in it.
        if not any(group.iterdir()) and group.lstat().st_mtime < cutoff:
            group.rmdir()
    if waiting:
        log.warning("kept %d run directories past the retention: their result files are not uploaded yet", waiting)
    return removed


def has_pending_results(run: Path) -> bool:
    """Whether the run's own `results/` (never a link the job left) holds a file the uploader takes."""
    try:
        fd = os.open(run / RESULTS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        with os.scandir(fd) as entries:
            return any(entry.name.endswith(RESULT_SUFFIX) for entry in entries)
    except OSError:
        return False
    finally:
        os.close(fd)


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def _last_write(path: Path) -> float:
    """When `path` was last written, as far as its owner cannot lie: a job may set any mtime (`touch -d
    2099-01-01` would keep its run forever), but not the change time, which every write moves too."""
    info = path.lstat()
    return min(info.st_mtime, info.st_ctime)


def _newest_change(directory: Path) -> float:
    """When the run last wrote: its directory or its log (a long run's log changes, its directory may not)."""
    times = [_last_write(directory)]
    for name in (RUN_LOG, "cleanup.log", "repair.log"):
        with contextlib.suppress(OSError):
            times.append(_last_write(directory / name))
    return max(times)
