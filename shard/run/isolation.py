"""What separates a job from the shard that runs it: its environment, its user, and what it can open.

A job is untrusted code. It must not learn the shard's token or database credentials, so its
environment is built from an allowlist (never the shard's own environment minus a denylist), and,
when the shard runs as root, it runs as another user (FLEETSHARD_JOB_USER, `nobody` by default),
which can neither read the shard's `/proc/PID/environ` nor open its data dir, database or token
file. As the shard's own user a job could read all of those: the start log says which applies.
"""

import ctypes
import ctypes.util
import logging
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Names a job inherits from the shard's environment (LC_* too); everything else it gets is set
# explicitly (the FLEETSHARD_* job variables of docs/protocol.md, HOME) or listed by the operator.
ALLOWED_ENV = ("PATH", "LANG", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# Private to the shard: no passthrough list can hand these to a job.
NEVER_PASSED = ("DATABASE_URL", "SECRET_KEY")


class IsolationError(Exception):
    """The shard cannot keep its secrets from jobs as configured: it refuses to start."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int


def resolve_job_user(name: str) -> JobUser | None:
    """The user jobs run as, or None for the shard's own user (not root, or `root` chosen explicitly)."""
    if os.geteuid() != 0 or name == "root":
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise IsolationError(f"FLEETSHARD_JOB_USER={name}: no such user") from None
    if entry.pw_uid == 0:
        return None
    return JobUser(name, entry.pw_uid, entry.pw_gid)


PR_SET_DUMPABLE = 4


def hide_environ() -> bool:
    """Makes this process undumpable, so processes of its own user cannot read its /proc/PID/environ.

    For a shard that runs jobs as its own user: its environment (the token, DATABASE_URL) would
    otherwise be one `cat /proc/$PPID/environ` away. Its children are dumpable again after exec.
    Returns False where the call is not available.
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    result: int = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return result == 0


def describe_job_user(user: JobUser | None) -> str:
    if user is not None:
        return f"jobs run as user {user.name} (uid {user.uid}), apart from the shard's files and environment"
    me = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        return "jobs run as root (FLEETSHARD_JOB_USER=root): they can read everything the shard can"
    return f"jobs run as the shard's own user {me} (not root, so no other user): they can read what the shard can"


def passthrough_names(setting: str) -> tuple[str, ...]:
    """The operator's FLEETSHARD_JOB_ENV_PASSTHROUGH: comma-separated names, minus the shard's own secrets."""
    names = tuple(n.strip() for n in setting.split(",") if n.strip())
    refused = [n for n in names if n.startswith("FLEETSHARD_") or n in NEVER_PASSED]
    if refused:
        log.warning("FLEETSHARD_JOB_ENV_PASSTHROUGH: never passed to jobs: %s", ", ".join(refused))
    return tuple(n for n in names if n not in refused)


def inherited_env(passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The part of a job's environment that comes from the shard's: the allowlist and the operator's names."""
    wanted = set(ALLOWED_ENV) | set(passthrough)
    env = {k: v for k, v in os.environ.items() if k in wanted or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def read_token_file(path: Path, user: JobUser | None) -> str:
    """The shard's token from FLEETSHARD_SHARD_TOKEN_FILE, which only the shard's user may read."""
    try:
        info = path.stat()
        token = path.read_text().strip()
    except OSError as exc:
        raise IsolationError(f"FLEETSHARD_SHARD_TOKEN_FILE={path}: {exc.strerror}") from exc
    if info.st_mode & 0o077:
        raise IsolationError(
            f"FLEETSHARD_SHARD_TOKEN_FILE={path} is readable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}): chmod 600 it"
        )
    if user is not None and info.st_uid == user.uid:
        raise IsolationError(f"FLEETSHARD_SHARD_TOKEN_FILE={path} belongs to the job user {user.name}")
    if not token:
        raise IsolationError(f"FLEETSHARD_SHARD_TOKEN_FILE={path} is empty")
    return token


def _chmod(path: Path, mode: int) -> None:
    try:
        if stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)
    except FileNotFoundError:
        pass


def protect_data(data_dir: Path, private_files: Iterable[Path]) -> None:
    """The data dir becomes unlistable (0711: results below it stay reachable), private files 0600.

    The SQLite database and its WAL and shared-memory files hold the whole shard; a job must not
    open them even by their well-known names.
    """
    _chmod(data_dir, 0o711)
    for path in private_files:
        for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            _chmod(each, 0o600)


def make_traversable(results_root: Path, user: JobUser | None) -> None:
    """Creates the results root (0711) and lets the job user pass through every directory above it.

    A directory above that the job user cannot pass through (a 0700 home or temp dir) gets the
    search bit for others, never the read bit: the job user can reach its run's directory by its
    name but list nothing on the way. Each change is logged.
    """
    results_root.mkdir(parents=True, exist_ok=True)
    results_root.chmod(0o711)
    if user is not None:
        _let_pass(results_root, user)


def let_reach(path: Path, user: JobUser | None) -> None:
    """Checks again, before a run, that the job user can pass through every directory above `path`
    (the input cache): a temp dir tightened since the shard started would leave its inputs unreadable."""
    if user is not None:
        _let_pass(path, user)


def _let_pass(path: Path, user: JobUser) -> None:
    """Adds o+x to each directory above `path` that the job user cannot pass through."""
    for parent in path.parents:
        info = parent.stat()
        if not _can_pass(info, user):
            log.warning("%s: adding o+x so job user %s reaches %s", parent, user.name, path)
            parent.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)


def out_of_reach(path: Path, user: JobUser | None) -> str | None:
    """Why the job user cannot reach `path` now (a directory above it it cannot pass through), or None.

    For a run that failed: a directory tightened while it ran (another process making its 0700 temp dir
    private again) leaves the job unable to open its own files by their absolute paths, a failure of
    the shard's setup and not of the test. Changes nothing: the next run's checks open the way again.
    """
    if user is None:
        return None
    for parent in path.parents:
        try:
            info = parent.stat()
        except OSError as exc:
            return f"{parent}: {exc.strerror}"
        if not _can_pass(info, user):
            return f"{parent} (mode {stat.S_IMODE(info.st_mode):04o}) does not let job user {user.name} through"
    return None


def _can_pass(info: os.stat_result, user: JobUser) -> bool:
    if info.st_uid == user.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == user.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def give_to(path: Path, user: JobUser | None) -> None:
    """A fresh run or host-command directory becomes the job user's, private to it (0700).

    The directories above are checked again for each run: a parent someone tightened since the
    shard started (a 0700 temp dir) would otherwise leave the job unable to reach its own directory
    by its absolute path, and its writes there would fail without a word.
    """
    if user is None:
        return
    os.chown(path, user.uid, user.gid)
    path.chmod(0o700)
    _let_pass(path, user)


def take_back(path: Path) -> None:
    """An ended run's directory becomes the shard's again (0700): every job runs as the same job user,
    so a later job could otherwise read, change or delete what an earlier one left (its results, its
    log). The directory itself is the shard's to change: its parent is the shard's (0711)."""
    try:
        os.lchown(path, os.geteuid(), os.getegid())
        if stat.S_ISDIR(path.lstat().st_mode):
            path.chmod(0o700)
    except OSError as exc:
        log.warning("%s: cannot take the ended run's directory back from the job user: %s", path, exc)
