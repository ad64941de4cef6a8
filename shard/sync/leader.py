"""Which process of a shard heartbeats: one at a time, however many share the shard's PostgreSQL database.

Elastic workers (docs/design.md, "Elastic workers") are many `run_shard` processes on one shard database,
beside the worker manager. Each would otherwise heartbeat: the master would get the same shard's
outbox from several processes at once. The heartbeat is held by whoever holds a PostgreSQL advisory
lock, on a connection of its own that nothing else closes; when that process dies its connection
goes and the lock with it, and another process takes over at its next try (one interval at most).
SQLite allows one process only, so there the heartbeat is always this process's.
"""

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, connections
from django.utils import timezone

from common.loop import Backoff, run_until_stopped
from common.pg_deadline import deadline
from shard.models import ShardState
from shard.sync.client import HeartbeatClient, ProtocolRefused

log = logging.getLogger(__name__)

# pg_advisory_lock's key for "this database's heartbeat" (advisory locks are per database).
HEARTBEAT_LOCK_KEY = 0x66736862_74  # "fshbt"

# A follower trusts the master's acceptance of this database while the holder's last heartbeat is
# this many intervals old at most.
ACCEPTED_FOR_INTERVALS = 3

# A holder checks its lock's connection this often, whatever its interval, and a process that takes
# the lock over from another waits TAKEOVER_S before it acts on it: a holder whose connection was
# killed (the lock then goes at once) has noticed and stopped by then, so two never heartbeat together.
CHECK_S = 0.1
TAKEOVER_S = 1.0

# A partitioned process (a network gone quiet, not a process killed) must not hang on its lock
# connection: a wait for a lock (the presence lock still held by this process's own previous,
# half-dead backend) gives up after LOCK_WAIT_S, and any round trip without an answer after
# ROUND_TRIP_S; either counts as a lost connection and is tried again (docs/design.md, "Elastic workers").
LOCK_WAIT_S = 5.0
ROUND_TRIP_S = 5.0

# What a new outbox entry or host event NOTIFYs (shard migration 0006): the holder heartbeats at once.
OUTBOX_CHANNEL = "fleetshard_outbox"


def worker_mode_refusal() -> str | None:
    """Why this database cannot have several shard processes, or None when it can (PostgreSQL)."""
    if connection.vendor == "postgresql":
        return None
    return (
        f"the shard's {connection.vendor} database allows one shard process only: "
        "elastic workers need the shard on PostgreSQL (DATABASE_URL=postgres://...)"
    )


def lock_key(name: str) -> int:
    """A pg_advisory_lock key (a signed 64-bit integer) for a name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class HeartbeatLeadership:
    """Takes and keeps this database's heartbeat lock (or another advisory lock) in a thread of its own.

    `lost` is set whenever this process does not hold the lock (and once `stop` is set), so a
    heartbeat loop given it stops at once; `held` is set while it does.
    """

    def __init__(
        self,
        stop: threading.Event,
        interval_s: float,
        key: int = HEARTBEAT_LOCK_KEY,
        what: str = "the heartbeat",
        presence: str = "",
        on_outbox: Callable[[], None] | None = None,
    ) -> None:
        self.stop = stop
        self.interval_s = interval_s
        self.key = key
        self.what = what
        # A scheduler's runner id: held on the same connection while this process lives, so that
        # processes on other machines can tell it is alive (shard.run.recovery.runner_alive).
        self.presence = presence
        # Called while this process holds the lock and another process (or this one) added to the
        # outbox: the heartbeat's nudge, so another worker's run's start or end is sent at once.
        self.on_outbox = on_outbox
        self.held = threading.Event()
        # Set while another live process holds the heartbeat: its answers from the master count here.
        self.follows = threading.Event()
        self.lost = threading.Event()
        self.lost.set()
        self.shared = connection.vendor == "postgresql"
        # Whether this process held the heartbeat when told to stop: it then sends the last ones.
        self.held_when_stopped = not self.shared
        self._conn: Any = None
        # When this process got the lock (monotonic); it acts on it TAKEOVER_S later.
        self._got_at: float | None = None
        # Whether another process held the lock once while this one lived (a takeover then waits).
        self._followed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.shared:
            self._take()
            threading.Thread(target=self._release_on_stop, name="leadership", daemon=True).start()
            return
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()

    def wait_held(self, timeout: float) -> bool:
        return self.held.wait(timeout)

    def _take(self) -> None:
        self.lost.clear()
        self.held.set()

    def _drop(self) -> None:
        self._got_at = None
        self.follows.clear()
        self.held.clear()
        self.lost.set()

    def _release_on_stop(self) -> None:
        self.stop.wait()
        self._drop()

    def _run(self) -> None:
        try:
            # A failed try is retried within one interval, so a standby takes over in one interval at most.
            run_until_stopped(
                self._step,
                self.stop,
                what=f"the lock of {self.what}",
                log=log,
                backoff=Backoff(base_s=self.interval_s, cap_s=self.interval_s),
                expected=(DatabaseError,),
            )
        finally:
            self.held_when_stopped = self.held.is_set()
            self._drop()
            self._close()

    def _step(self) -> float:
        try:
            self._try()
        except DatabaseError as exc:
            if self.held.is_set():
                log.warning("lost the lock of %s (%s): another process may take it", self.what, exc)
            self._drop()
            self._close()
            raise
        holding = self.held.is_set() or self._got_at is not None
        return min(CHECK_S, self.interval_s) if holding else self.interval_s

    def _try(self) -> None:
        if self._conn is None:
            # Not Django's thread connection: close_old_connections() must never release the lock.
            self._conn = connections.create_connection("default")
            self._conn.ensure_connection()
            if self.presence:
                with self._bounded(LOCK_WAIT_S + ROUND_TRIP_S) as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{int(LOCK_WAIT_S * 1000)}ms"])
                    cursor.execute("SELECT pg_advisory_lock(%s)", [presence_key(self.presence)])
        with self._bounded(ROUND_TRIP_S) as cursor:
            if self.held.is_set() or self._got_at is not None:
                cursor.execute("SELECT 1")
                self._heard_outbox()
                if self._got_at is not None and time.monotonic() - self._got_at >= TAKEOVER_S:
                    log.info("this process now runs %s", self.what)
                    self._got_at = None
                    self._take()
                return
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
            (got,) = cursor.fetchone()
            if got and self.on_outbox is not None:
                cursor.execute(f"LISTEN {OUTBOX_CHANNEL}")
        if got and self._followed:
            self.follows.clear()
            self._got_at = time.monotonic()
        elif got:
            log.info("this process now runs %s", self.what)
            self._take()
        else:
            self._followed = True
            self.follows.set()

    def _heard_outbox(self) -> None:
        """Notifications come in with the answer to the check (every CHECK_S while holding)."""
        notifies = self._conn.connection.notifies
        if notifies:
            notifies.clear()
            if self.on_outbox is not None:
                self.on_outbox()

    @contextlib.contextmanager
    def _bounded(self, seconds: float) -> Iterator[Any]:
        with (
            deadline(self._conn.connection, seconds, f"the lock connection of {self.what}"),
            self._conn.cursor() as cursor,
        ):
            yield cursor

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(DatabaseError):
                self._conn.close()
            self._conn = None


def presence_key(runner: str) -> int:
    return lock_key("runner:" + runner)


def runner_present(runner: str) -> bool:
    """Whether a live process holds `runner`'s presence lock in this (PostgreSQL) database now."""
    key = presence_key(runner)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        (free,) = cursor.fetchone()
        if free:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    return not free


def accepted_instance(interval_s: float) -> str | None:
    """This database's instance id when the process holding the heartbeat got the master's answer lately:
    its acceptance of that id then holds for a follower too (docs/protocol.md, "Shard instances"); else
    None. One read: a renewal, which clears the last answer with the id, cannot fall between the two."""
    row = ShardState.objects.filter(id=1).values_list("instance", "last_heartbeat_ok").first()
    if row is None:
        return None
    instance, last = row
    recent = last is not None and abs(timezone.now() - last) <= timedelta(seconds=interval_s * ACCEPTED_FOR_INTERVALS)
    return (instance or None) if recent else None


def heartbeat_loop(
    client: HeartbeatClient,
    leadership: HeartbeatLeadership,
    on_refused: Callable[[str], None],
    on_ingest: Callable[[], None] | None = None,
) -> None:
    """Heartbeats while this process holds the shard's heartbeat, until the leadership's `stop`; a
    refusal by the master (which no retry fixes) goes to `on_refused` and ends the loop. Meant for a
    thread of its own."""
    stop = leadership.stop
    leadership.start()
    try:

        def step() -> float:
            if leadership.wait_held(0.5):
                client.run(leadership.lost, on_ingest=on_ingest)
            return 0.0

        try:
            # A database hiccup must not end the heartbeat: it is logged and retried.
            run_until_stopped(
                step, stop, what="heartbeat", log=log, backoff=Backoff(base_s=1.0, cap_s=5.0), fatal=(ProtocolRefused,)
            )
        except ProtocolRefused as exc:
            on_refused(str(exc))
    finally:
        connection.close()
