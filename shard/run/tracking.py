"""Tracking every process of a run, so abort, timeout, shutdown and crash recovery kill them all.

A run's process group is not enough: `setsid daemon &` leaves it, and the host would go back to
`Ready` with the daemon still running. So each run (and each cleanup or repair command) gets its
own cgroup where the machine lets the shard make one: cgroup v2 (killed with `cgroup.kill`), else
cgroup v1 `freezer` (frozen, killed, thawed) or `pids` (forks stopped, killed). A child joins its
cgroup before it execs, so nothing it starts is ever outside. Where no cgroup can be made, the
process group is the fallback, and the start log says so.

Layout: `<hierarchy>/<own>/fleetshard/<runner>/<name>`, where `<own>` is the shard's own cgroup (from
/proc/self/cgroup) when it may make cgroups there (systemd's `Delegate=yes`), so runs are accounted
and limited with the unit that started them; else the hierarchy's top, as before. The runner (one
scheduler process) owns a directory, so a restarted shard kills everything a crashed one left by the
dead runner's id alone.
"""

import contextlib
import errno
import logging
import os
import re
import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

AUTO = "auto"
CGROUP_V2 = "cgroup2"
FREEZER = "freezer"
PIDS = "pids"
PROCESS_GROUP = "pgroup"
MECHANISMS = (AUTO, CGROUP_V2, FREEZER, PIDS, PROCESS_GROUP)

TOP = "fleetshard"
KILL_WAIT_S = 10.0


def slug(text: str) -> str:
    """A runner id or run name as one cgroup directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"


def proc_stat(pid: int | str, *, gone_only: bool = False) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first); [] when the process is gone.

    The command name (field 2) may hold spaces and parentheses: the split is after its closing one.
    With `gone_only`, a read that failed for another reason (no file descriptors left, no memory)
    raises instead of passing for "gone": for a caller that would kill what it believes dead.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return []
    except OSError:
        if gone_only:
            raise
        return []
    return stat[stat.rfind(")") + 2 :].split()


def process_state(pid: int) -> str | None:
    """The state letter of a process (None when gone); 'Z' is a zombie, dead in all but name."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def live(pids: list[int]) -> list[int]:
    return [p for p in pids if process_state(p) not in (None, "Z")]


def _signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


class Group(ABC):
    """The processes of one run."""

    path: Path | None = None

    def join_fd(self) -> int | None:
        """An open fd the child writes "0" to (before exec) to join; None when there is nothing to join."""
        return None

    @abstractmethod
    def pids(self, leader: int | None) -> list[int]:
        """Live processes of the run (the main one is `leader`, once started)."""

    def signal(self, signum: int, leader: int | None) -> None:
        _signal_each(self.pids(leader), signum)

    def kill(self, leader: int | None) -> None:
        """SIGKILL to every process of the run."""
        self.signal(signal.SIGKILL, leader)

    def remove(self) -> None:  # noqa: B027 (a process group has nothing to drop)
        """Drops the (empty) group; a no-op when processes are left or there is nothing to drop."""


class ProcessGroup(Group):
    """The fallback: the run's own process group (its leader is the main process)."""

    def pids(self, leader: int | None) -> list[int]:
        if leader is None:
            return []
        return group_members(leader)

    def signal(self, signum: int, leader: int | None) -> None:
        if leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signum)


class Cgroup(Group):
    path: Path

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.kind = kind
        self._fd: int | None = None

    def join_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        return self._fd

    def started(self) -> None:
        """The child has joined (or failed to): the fd is no longer needed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def pids(self, leader: int | None = None) -> list[int]:
        return live(cgroup_pids(self.path))

    def kill(self, leader: int | None = None) -> None:
        kill_cgroup(self.path, self.kind)

    def remove(self) -> None:
        self.started()
        remove_cgroup(self.path)


def cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
    except OSError:
        return False
    return True


def kill_cgroup(path: Path, kind: str) -> None:
    """SIGKILL to everything in the cgroup, in a way no fork can race; returns once it is empty."""
    if kind == CGROUP_V2 and _write(path / "cgroup.kill", "1"):
        _wait_empty(path)
        return
    thaw = None
    if kind == FREEZER and _write(path / "freezer.state", "FROZEN"):
        thaw = path / "freezer.state"
    elif kind == PIDS:
        _write(path / "pids.max", "0")
    elif kind == CGROUP_V2 and _write(path / "cgroup.freeze", "1"):
        thaw = path / "cgroup.freeze"
    try:
        deadline = time.monotonic() + KILL_WAIT_S
        while (pids := cgroup_pids(path)) and time.monotonic() < deadline:
            _signal_each(pids, signal.SIGKILL)
            if thaw is not None:
                # A frozen process dies of SIGKILL only once thawed; it cannot fork in between.
                _write(thaw, "THAWED" if kind == FREEZER else "0")
                thaw = None
            time.sleep(0.02)
    finally:
        if thaw is not None:
            _write(thaw, "THAWED" if kind == FREEZER else "0")


def _wait_empty(path: Path) -> None:
    deadline = time.monotonic() + KILL_WAIT_S
    while live(cgroup_pids(path)) and time.monotonic() < deadline:
        time.sleep(0.02)


def remove_cgroup(path: Path) -> None:
    """Removes an empty cgroup and its empty children (a cgroup is a directory of kernel files)."""
    if not path.is_dir():
        return
    for child in [c for c in path.iterdir() if c.is_dir()]:
        remove_cgroup(child)
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
            log.warning("cannot remove cgroup %s: %s", path, exc)


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
        fields = proc_stat(entry)
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of each cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        head, _, tail = line.partition(" - ")
        parts, rest = head.split(), tail.split()
        if len(parts) > 4 and len(rest) > 2 and rest[0] in ("cgroup", "cgroup2"):
            found.append((parts[4], rest[0], set(rest[2].split(","))))
    return found


def _candidates() -> list[tuple[str, Path]]:
    mounts = _mounts()
    found = [(CGROUP_V2, Path(point)) for point, fstype, _ in mounts if fstype == "cgroup2"]
    for kind in (FREEZER, PIDS):
        found += [(kind, Path(point)) for point, fstype, opts in mounts if fstype == "cgroup" and kind in opts]
    return found


@dataclass(frozen=True)
class Tracker:
    """Where this machine puts runs: `kind` is one of MECHANISMS, `root` the fleetshard cgroup (if any),
    `own`: whether that is under the shard's own cgroup (delegated to it) rather than the hierarchy's top."""

    kind: str
    root: Path | None = None
    own: bool = False

    def describe(self) -> str:
        if self.root is None:
            return "each run in its own process group (no cgroup could be made: a setsid daemon can escape)"
        where = (
            "the shard's own cgroup, delegated to it"
            if self.own
            else "the hierarchy's top: the shard's own cgroup is not delegated (writable) to it"
        )
        return f"each run in its own cgroup ({self.kind}) under {self.root} ({where})"

    def group(self, runner: str, name: str) -> Group:
        """A new, empty group for one run, or the process-group fallback."""
        if self.root is None or not name:
            return ProcessGroup()
        path = self.root / slug(runner) / slug(name)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot make cgroup %s (%s): this run is tracked by its process group", path, exc)
            return ProcessGroup()
        # A leftover of a reused name must not be mistaken for this run.
        kill_cgroup(path, self.kind)
        if self.kind == PIDS:
            _write(path / "pids.max", "max")
        return Cgroup(path, self.kind)

    def runners(self) -> list[str]:
        """The runner ids that have cgroups here (each as `machine:pid:start`, read back from its directory)."""
        if self.root is None or not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            parts = path.name.rsplit("_", 2)
            if path.is_dir() and len(parts) == 3 and not path.name.startswith("probe-"):
                found.append(":".join(parts))
        return found

    def kill_runner(self, runner: str) -> int:
        """Kills everything a (dead) runner left in its cgroups and removes them; returns how many groups."""
        if self.root is None:
            return 0
        base = self.root / slug(runner)
        if not base.is_dir():
            return 0
        groups = [c for c in base.iterdir() if c.is_dir()]
        for path in groups:
            if cgroup_pids(path):
                log.warning("killing what is left in %s", path)
            kill_cgroup(path, self.kind)
        remove_cgroup(base)
        return len(groups)


def _usable(kind: str, mount: Path, top: str) -> Path | None:
    """The fleetshard cgroup `top` under `mount` if this process can make and fill cgroups there."""
    root = mount / top
    probe = root / f"probe-{os.getpid()}"
    made = not root.exists()
    try:
        probe.mkdir(parents=True, exist_ok=True)
        usable = os.access(probe / "cgroup.procs", os.W_OK)
        if kind == CGROUP_V2:
            usable = usable and ((probe / "cgroup.kill").exists() or (probe / "cgroup.freeze").exists())
        probe.rmdir()
        if not usable and made:
            root.rmdir()
    except OSError:
        return None
    return root if usable else None


def own_cgroup(kind: str, cgroup_file: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup in the hierarchy of `kind` ("/" at the top), from /proc/self/cgroup."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if (kind == CGROUP_V2 and controllers == "") or (kind != CGROUP_V2 and kind in controllers.split(",")):
            return path
    return None


def _placed(kind: str, mount: Path, top: str) -> tuple[Path, bool] | None:
    """Under the shard's own cgroup when it may make cgroups there, else at the hierarchy's top."""
    own = own_cgroup(kind)
    if own and own != "/" and ".." not in own.split("/"):
        root = _usable(kind, mount / own.lstrip("/"), top)
        if root is not None:
            return root, True
    root = _usable(kind, mount, top)
    return (root, False) if root is not None else None


def detect(wanted: str = AUTO, top: str = TOP) -> Tracker:
    """The best mechanism this machine allows (or `wanted`, when it is available), its cgroups under `top`.

    Shards on one machine that name different tops never reap each other's runs."""
    if wanted not in MECHANISMS:
        raise ValueError(f"FLEETSHARD_PROCESS_TRACKING must be one of {', '.join(MECHANISMS)}, not {wanted!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", top):
        raise ValueError(f"FLEETSHARD_CGROUP_NAME must be one directory name of letters, digits, . _ -, not {top!r}")
    if wanted != PROCESS_GROUP:
        for kind, mount in _candidates():
            if wanted not in (AUTO, kind):
                continue
            placed = _placed(kind, mount, top)
            if placed is not None:
                return Tracker(kind, *placed)
    if wanted not in (AUTO, PROCESS_GROUP):
        log.warning("process tracking %s is not available here: using process groups", wanted)
    return Tracker(PROCESS_GROUP)
