"""A client-side deadline for one PostgreSQL round trip on a connection that must never hang.

A server that went silent (a network partition, a dropped NAT entry, a proxy that stopped forwarding)
answers nothing, and libpq waits for its reply forever: `statement_timeout` and `lock_timeout` are the
server's and never fire there, and TCP keepalives probe only an idle connection (a proxy's own kernel
answers them anyway). A listening thread or a lock holder that blocks there stops doing its one job
without a word. `deadline` shuts the connection's socket down when the round trip is late, so libpq's
wait ends with an error the caller already handles as a lost connection.
"""

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import OperationalError


class DeadlineExceeded(OperationalError):
    """Raised by `deadline` when it had to cut the connection (whatever error libpq raised then)."""


class _Watchdog:
    """One thread for every deadline of the process: a lock holder checks its connection ten times a
    second, and a thread per check would be a thread started every 0.1 s."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._next = 0
        self._pid = 0

    def add(self, seconds: float, cut: Callable[[], None]) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use, or a fork: the thread is this process's
                self._pid = os.getpid()
                self._due.clear()
                threading.Thread(target=self._run, name="db-deadlines", daemon=True).start()
            self._next += 1
            self._due[self._next] = (time.monotonic() + seconds, cut)
            self._cond.notify()
            return self._next

    def remove(self, token: int) -> None:
        with self._cond:
            self._due.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                late = [token for token, (when, _) in self._due.items() if when <= now]
                cuts = [self._due.pop(token)[1] for token in late]
                if not cuts:
                    soonest = min((when for when, _ in self._due.values()), default=None)
                    self._cond.wait(None if soonest is None else soonest - now)
            for cut in cuts:
                with contextlib.suppress(Exception):
                    cut()


_watchdog = _Watchdog()


@contextlib.contextmanager
def deadline(raw_conn: Any, seconds: float, what: str = "the database") -> Iterator[None]:
    """Runs the block; if it takes longer than `seconds`, the socket of `raw_conn` (a psycopg2
    connection) is shut down, the connection is lost for good, and DeadlineExceeded is raised."""
    lock = threading.Lock()
    done = False
    cut = False

    def cut_off() -> None:
        nonlocal cut
        with lock:
            if done:
                return
            cut = True
            dup = socket.socket(fileno=os.dup(raw_conn.fileno()))
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()

    token = _watchdog.add(seconds, cut_off)
    failed: Exception | None = None
    try:
        yield
    except Exception as exc:
        failed = exc
    finally:
        _watchdog.remove(token)
        with lock:
            done = True
    if cut:
        raise DeadlineExceeded(f"{what} did not answer within {seconds:g} s") from failed
    if failed is not None:
        raise failed
