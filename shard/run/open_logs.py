"""The logs of the runs this process is running, by path, so the log shipper reads through the
shard's own descriptor: a job owns its run directory and may rename `job.log` (its output still
goes to the file the shard opened) or put something else under that name.

A run's descriptor is registered when its executor opens the log and forgotten before it is closed;
the shipper takes a duplicate of its own, which keeps the file readable to its end after the run.
"""

import os
import threading
from pathlib import Path

_lock = threading.Lock()
_open: dict[str, int] = {}


def _key(path: Path | str) -> str:
    return os.path.normpath(os.fspath(path))


def remember(path: Path | str, fd: int) -> None:
    with _lock:
        _open[_key(path)] = fd


def forget(path: Path | str) -> None:
    """Called before the run's descriptor is closed: no duplicate is taken of a closed (reused) one."""
    with _lock:
        _open.pop(_key(path), None)


def duplicate(path: Path | str) -> int | None:
    """A descriptor of the log the shard opened at `path` for a run it is running, or None."""
    with _lock:
        fd = _open.get(_key(path))
        return None if fd is None else os.dup(fd)
