"""Bounds on streamed timeline exports (issue 23): each holds a database connection and, on
PostgreSQL, a REPEATABLE READ snapshot for as long as its reader takes, so a few slow readers could
hold connections and old snapshots (which keep VACUUM from cleaning) without end.

- A cap per user and per serving process on exports streaming at once; beyond it, 429 with the
  seconds until the soonest of them must end (Retry-After).
- A deadline per export: once past it, the stream ends with a note saying it was cut short, and the
  transaction (the snapshot) ends. A reader that stops reading cannot hold it either: before each
  chunk leaves, PostgreSQL is told to end the transaction if it idles past the deadline
  (idle_in_transaction_session_timeout), which closes that backend and frees its connection.
"""

import math
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TypeVar

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection

Event = TypeVar("Event")
Chunk = TypeVar("Chunk")

# A slot counts a little past its deadline: the time a stream takes to notice and end.
GRACE_S = 5.0


@dataclass
class Deadline:
    """When an export must end (time.monotonic()), and whether to have PostgreSQL enforce it on a reader
    that stops reading (not inside a test's own transaction, which it would end too)."""

    seconds: float
    at: float
    enforce_idle: bool = True

    @classmethod
    def starting_now(cls, seconds: float, *, enforce_idle: bool = True) -> "Deadline":
        return cls(seconds, time.monotonic() + seconds, enforce_idle)

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def before_idle(self) -> None:
        """Called before a chunk leaves, while the export's transaction is open: the backend may idle
        in it (the reader not reading) only until the deadline."""
        if not self.enforce_idle or connection.vendor != "postgresql" or not connection.in_atomic_block:
            return
        ms = max(1, math.ceil((self.at - time.monotonic()) * 1000))
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)", [str(ms)])

    def note(self) -> str:
        return (
            f"export cut short: it reached its deadline of {self.seconds:g} s "
            "(FLEETSHARD_EXPORT_DEADLINE_S); narrow the window (since, until, shard, label, job) or read faster"
        )

    @classmethod
    def never(cls) -> "Deadline":
        """No deadline: for writing a file (the CLI, the bench), where no reader holds a connection."""
        return cls(math.inf, math.inf, enforce_idle=False)

    def chunks(self, events: Iterator[Event], pack: Callable[[Event], Sequence[Chunk]]) -> Generator[Chunk, None, str]:
        """The chunks `pack` makes of `events` (it returns them when it has gathered enough, else none),
        until the events end or, after chunks leave, the deadline has passed. Returns this deadline's
        note if cut short, else "" (`cut = yield from deadline.chunks(...)`); the caller flushes what
        `pack` still holds and closes the trace. The events' generator is closed either way, ending
        its transaction, so the caller's tail runs outside it. Shared by the Chrome trace and the
        Perfetto export, so both cut short alike."""
        try:
            for event in events:
                chunks = pack(event)
                if not chunks:
                    continue
                self.before_idle()
                yield from chunks
                if self.passed():
                    return self.note()
        except DatabaseError:
            # PostgreSQL ended the transaction of a reader that stopped reading until the deadline.
            if not self.passed():
                raise
            return self.note()
        finally:
            end_quietly(events)
        return ""


def end_quietly(events: Iterator[object]) -> None:
    """Ends the events' generator, and with it their transaction; on a connection PostgreSQL closed at
    the deadline, closing the cursor fails, and there is nothing left to end."""
    close = getattr(events, "close", None)
    if close is not None:
        with suppress(Exception):
            close()


@dataclass
class _Held:
    user: int
    expires: float


@dataclass
class ExportSlots:
    """The exports streaming in this process; thread-safe (gunicorn's threads share it)."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _held: dict[int, _Held] = field(default_factory=dict)
    _next: int = 0

    def take(self, user: int, *, per_user: int, per_process: int, hold_s: float) -> "Slot | float":
        """A slot for `user`'s export, or the seconds until one may be free (for Retry-After)."""
        now = time.monotonic()
        with self._lock:
            self._held = {k: h for k, h in self._held.items() if h.expires > now}
            mine = [h.expires for h in self._held.values() if h.user == user]
            if len(mine) >= per_user:
                return max(1.0, min(mine) - GRACE_S - now)
            if len(self._held) >= per_process:
                return max(1.0, min(h.expires for h in self._held.values()) - GRACE_S - now)
            self._next += 1
            self._held[self._next] = _Held(user, now + hold_s + GRACE_S)
            return Slot(self, self._next)

    def release(self, key: int) -> None:
        with self._lock:
            self._held.pop(key, None)

    def count(self) -> int:
        now = time.monotonic()
        with self._lock:
            return sum(1 for h in self._held.values() if h.expires > now)


@dataclass
class Slot:
    slots: ExportSlots
    key: int

    def release(self) -> None:
        self.slots.release(self.key)


class Holding:
    """A response's chunks that free their slot when the response closes: read to the end, its reader
    gone, or never started (a generator that never ran runs no `finally`)."""

    def __init__(self, chunks: Iterator[bytes], slot: Slot) -> None:
        self.chunks, self.slot = chunks, slot

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks

    def close(self) -> None:
        try:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()
        finally:
            self.slot.release()


SLOTS = ExportSlots()


def take_export_slot(user: int) -> Slot | float:
    return SLOTS.take(
        user,
        per_user=settings.FLEETSHARD_EXPORTS_PER_USER,
        per_process=settings.FLEETSHARD_EXPORTS_PER_PROCESS,
        hold_s=settings.FLEETSHARD_EXPORT_DEADLINE_S,
    )
