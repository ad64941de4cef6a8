"""Tells waiting shards that something they must see changed (docs/protocol.md, "Waiting for news").

A service that changes what a shard must see calls `shards_changed` inside its transaction; once it
commits, every serving process of the master hears of it: on PostgreSQL by NOTIFY on one channel, which
each process hears on its one listening connection; on SQLite (one machine) by a datagram to each
serving process's socket in the data directory. A long-poll (`wait_for_news`) then waits on the
process's `NewsBoard`, never on the database: no connection per waiting shard, no polling loop.

The board remembers when each shard last had news, so a long-poll says how long ago its shard's last
heartbeat was sent and learns at once of a change that came in between: nothing falls through the gap
between a heartbeat and the next wait. A lost notification only delays a shard to its next interval.

The same channel carries the news that a token, a user or a shard changed (`tokens_changed`, sent by
signal handlers below): each process then empties its token cache (master/access/token_cache.py), which
it trusts only while its listener hears. That news is sent within the changing transaction on PostgreSQL
(NOTIFY is delivered at commit, or never if it rolls back), not after it as the shards' news is.
"""

import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.db.models.signals import post_delete, post_save

from common.models import Shard
from common.pg_deadline import deadline
from master.access.token_cache import CACHE as TOKEN_CACHE
from master.access.token_cache import TokenCache
from master.models import Token

log = logging.getLogger(__name__)

CHANNEL = "fleetshard_shards"
# The payload saying that tokens, users or shards changed: every token cache is emptied. Not a shard id,
# so a process that predates the token cache ignores it (decode).
TOKENS_PAYLOAD = "tokens"
# NOTIFY payloads are limited to 8000 bytes; a datagram to a little more than that is always sent whole.
MAX_PAYLOAD = 7000
LISTEN_POLL_S = 1.0
# A shard needs one wait at a time; a few allow for retries racing their originals. More from one token
# (a hostile or broken shard) would take other shards' places.
MAX_WAITS_PER_SHARD = 4
RECONNECT_S = 2.0
# The listening connection is asked a round trip this often and must answer within LIVENESS_TIMEOUT_S:
# a connection dropped without a word (a partition, a NAT or proxy that forgot it) would otherwise look
# like a quiet one for ever, and every notification would be missed (docs/protocol.md, "Waiting for news").
LIVENESS_S = 10.0
LIVENESS_TIMEOUT_S = 5.0
APPLICATION_NAME = "fleetshard news listener"
# How often a held wait looks whether its client is still there (one that left frees its thread).
GONE_CHECK_S = 2.0
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the final NUL
# A change that wakes more than STORM_WAKES waits of one process at once (a label moved that touches
# every shard) wakes them at random moments over n / STORM_WAKES_PER_S seconds, STORM_SPREAD_S at most:
# their heartbeats would otherwise all reach the master in the same instant (docs/protocol.md,
# "Waiting for news"). Fewer are woken at once, as a single change's are.
STORM_WAKES = 20
STORM_WAKES_PER_S = 200.0
STORM_SPREAD_S = 2.0
# The share of a wait's timeout that may be cut at random (docs/protocol.md, "Waiting for news").
WAIT_SPREAD = 0.25


class NewsUnavailable(Exception):
    """This process hears no notifications (its listener is down): the shard falls back to its interval."""


class TooManyWaits(Exception):
    """This process already holds as many waits as it may: the shard falls back to its interval."""


def encode(shard_ids: Iterable[int]) -> list[str]:
    """The payloads naming `shard_ids`, each at most MAX_PAYLOAD characters."""
    payloads, current = [], ""
    for shard_id in sorted(set(shard_ids)):
        part = str(int(shard_id))
        if current and len(current) + 1 + len(part) > MAX_PAYLOAD:
            payloads.append(current)
            current = ""
        current = f"{current},{part}" if current else part
    if current:
        payloads.append(current)
    return payloads


def decode(payload: str) -> set[int]:
    """The shard ids of a payload; anything else in it is ignored (it comes from another process)."""
    ids = set()
    for part in payload[: MAX_PAYLOAD * 2].split(","):
        if part.isdigit() and len(part) < 19:
            ids.add(int(part))
    return ids


class NewsBoard:
    """When each shard last had news, and the waits to end when it has more; one per process."""

    def __init__(self, max_waits: int) -> None:
        self.max_waits = max_waits
        self._lock = threading.Lock()
        self._last: dict[int, float] = {}
        self._waiters: dict[int, set[threading.Event]] = {}
        # How long a wait woken by a storm waits more before it answers.
        self._delays: dict[threading.Event, float] = {}
        self._held = 0
        # Since when this process hears every notification (monotonic); None while it hears none.
        self.listening_since: float | None = None
        # The process is stopping: waits end without news, and the shard asks again (another process).
        self.closing = False

    @property
    def held(self) -> int:
        return self._held

    def publish(self, shard_ids: Iterable[int]) -> None:
        now = time.monotonic()
        with self._lock:
            woken: list[threading.Event] = []
            for shard_id in shard_ids:
                self._last[shard_id] = now
                woken += self._waiters.get(shard_id, ())
            self._wake(woken)

    def _wake(self, events: list[threading.Event]) -> None:
        """Under the lock: ends the waits, a storm's spread over its time (STORM_WAKES)."""
        if len(events) > STORM_WAKES:
            spread = min(STORM_SPREAD_S, len(events) / STORM_WAKES_PER_S)
            for event in events:
                self._delays[event] = random.uniform(0.0, spread)
        for event in events:
            event.set()

    def listening(self, since: float | None) -> None:
        """The listener (re)connected at `since`, or lost its connection (None): every wait ends now,
        since news may have been missed, and its shard heartbeats."""
        with self._lock:
            self.listening_since = since
            self._wake([event for events in self._waiters.values() for event in events])

    def close(self) -> None:
        """The process is stopping: every wait ends now, without news, so its shard asks again at once
        (of the process that replaces this one) rather than fall back to its interval."""
        with self._lock:
            self.closing = True
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def wait(
        self, shard_id: int, since_s: float | None, timeout_s: float, gone: Callable[[], bool] | None = None
    ) -> bool:
        """Whether `shard_id` had news in the last `since_s` seconds or gets some within `timeout_s`;
        False as soon as `gone` says the client left."""
        event = threading.Event()
        now = time.monotonic()
        with self._lock:
            if self.closing:
                return False
            if self.listening_since is None:
                raise NewsUnavailable("this master process hears no change notifications")
            if since_s is not None:
                if now - since_s < self.listening_since:
                    return True  # news then may have come before this process listened
                if self._last.get(shard_id, float("-inf")) >= now - since_s:
                    return True
            if self._held >= self.max_waits:
                raise TooManyWaits(f"this master process already holds {self._held} waits")
            if len(self._waiters.get(shard_id, ())) >= MAX_WAITS_PER_SHARD:
                raise TooManyWaits(f"this master process already holds {MAX_WAITS_PER_SHARD} waits of this shard")
            self._held += 1
            self._waiters.setdefault(shard_id, set()).add(event)
        try:
            news = self._await(event, now + timeout_s, gone)
            with self._lock:
                delay = self._delays.pop(event, 0.0)
            if news and delay and not self.closing:
                time.sleep(delay)
        finally:
            with self._lock:
                self._delays.pop(event, None)
                self._held -= 1
                waiters = self._waiters.get(shard_id)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[shard_id]
        if self.closing:
            return False
        if news and self.listening_since is None:
            raise NewsUnavailable("this master process lost its change notifications")
        return news

    @staticmethod
    def _await(event: threading.Event, deadline: float, gone: Callable[[], bool] | None) -> bool:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return event.is_set()
            if event.wait(left if gone is None else min(left, GONE_CHECK_S)):
                return True
            if gone is not None and gone():
                return False


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


def socket_dir() -> Path:
    return Path(settings.DATA_DIR) / "notify"


class Listener:
    """The process's one listening thread: PostgreSQL LISTEN, or a datagram socket on SQLite."""

    def __init__(self, board: NewsBoard, token_cache: TokenCache | None = None) -> None:
        self.board = board
        # The process's token cache, which this listener speaks for (the process's own listener only).
        self.token_cache = token_cache
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="news-listener", daemon=True)
        self._failing = False

    def _heard(self) -> None:
        if self.token_cache is not None:
            self.token_cache.hearing(True)
        self.board.listening(time.monotonic())
        if self._failing:
            log.warning("change notifications heard again")
            self._failing = False

    def _payload(self, payload: str) -> set[int]:
        """The shard ids a payload names; the news that tokens changed empties the token cache at once."""
        if payload == TOKENS_PAYLOAD:
            if self.token_cache is not None:
                self.token_cache.invalidate()
            return set()
        return decode(payload)

    def _run(self) -> None:
        listen = self._listen_postgres if _is_postgres() else self._listen_socket
        while not self.stop.is_set():
            try:
                listen()
            except Exception as exc:
                # Said once per outage (a database down for hours, a data directory too long for a
                # socket), not every RECONNECT_S.
                if self.board.listening_since is not None or not self._failing:
                    log.warning("change notifications lost (%s); trying again every %g s", exc, RECONNECT_S)
                else:
                    log.debug("change notifications still lost: %s", exc)
                self._failing = True
            if self.token_cache is not None:
                self.token_cache.hearing(False)
            if self.stop.is_set():
                self.board.close()
            self.board.listening(None)
            self.stop.wait(RECONNECT_S)

    def _listen_postgres(self) -> None:
        wrapper = connections.create_connection("default")
        # Named, so that an operator (or a test) can tell it from the serving connections.
        params = wrapper.get_connection_params() | {"application_name": APPLICATION_NAME}
        conn: Any = wrapper.get_new_connection(params)
        try:
            conn.autocommit = True
            with deadline(conn, LIVENESS_TIMEOUT_S, "the listening connection"), conn.cursor() as cur:
                cur.execute(f"LISTEN {CHANNEL}")
            self._heard()
            checked = time.monotonic()
            while not self.stop.is_set():
                readable, _, _ = select.select([conn], [], [], min(LISTEN_POLL_S, LIVENESS_S))
                if time.monotonic() - checked >= LIVENESS_S:
                    # Notifications that came meanwhile are read with the answer, and handled below.
                    with deadline(conn, LIVENESS_TIMEOUT_S, "the listening connection"), conn.cursor() as cur:
                        cur.execute("SELECT 1")
                    checked = time.monotonic()
                elif not readable:
                    continue
                else:
                    conn.poll()
                ids: set[int] = set()
                while conn.notifies:
                    ids |= self._payload(conn.notifies.pop(0).payload)
                if ids:
                    self.board.publish(ids)
        finally:
            conn.close()

    def _listen_socket(self) -> None:
        directory = socket_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = directory / f"{os.getpid()}.sock"
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise OSError(f"{path} is too long for a Unix socket; a shorter FLEETSHARD_DATA_DIR would do")
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(path))
            sock.settimeout(LISTEN_POLL_S)
            self._heard()
            while not self.stop.is_set():
                try:
                    data = sock.recv(MAX_PAYLOAD * 2)
                except TimeoutError:
                    continue
                ids = self._payload(data.decode("ascii", "replace"))
                if ids:
                    self.board.publish(ids)
        finally:
            sock.close()
            path.unlink(missing_ok=True)


_board: NewsBoard | None = None
_listener: Listener | None = None
_pid: int | None = None
_start_lock = threading.Lock()


def news_board() -> NewsBoard:
    """This process's board, its listener started on first use (and again after a fork)."""
    global _board, _listener, _pid
    with _start_lock:
        if _board is None or _pid != os.getpid():
            _board = NewsBoard(settings.FLEETSHARD_LONGPOLL_MAX_WAITS)
            _listener = Listener(_board, TOKEN_CACHE)
            _pid = os.getpid()
            _listener.thread.start()
        return _board


def start_listener() -> tuple[threading.Thread, threading.Event]:
    """For `serve` (FLEETSHARD_SERVE_BACKGROUND): listen from the worker's start, not its first wait."""
    news_board()
    assert _listener is not None
    return _listener.thread, _listener.stop


def stop_listener() -> None:
    """Stops this process's listener and closes its connection (a test session's end)."""
    global _board, _listener
    with _start_lock:
        if _listener is not None:
            _listener.stop.set()
            _listener.thread.join(LISTEN_POLL_S * 3)
        _board = _listener = None


def wait_for_news(
    shard_id: int, since_s: float | None, timeout_s: float, gone: Callable[[], bool] | None = None
) -> bool:
    """Whether the shard has news, within `timeout_s` less up to WAIT_SPREAD of it at random: waits
    begun together (every shard after a master's restart) would otherwise end together, and come back
    together, for as long as the fleet runs."""
    timeout_s *= 1 - WAIT_SPREAD * random.random()
    board = news_board()
    if board.listening_since is None:
        # Just started: give the listener a moment to connect before calling it unavailable.
        deadline = time.monotonic() + 2.0
        while board.listening_since is None and not board.closing and time.monotonic() < deadline:
            time.sleep(0.02)
    return board.wait(shard_id, since_s, timeout_s, gone)


def _send(payloads: list[str]) -> None:
    """After commit: tell every serving process. A failure costs the shards only their interval."""
    try:
        if _is_postgres():
            with connection.cursor() as cur:
                for payload in payloads:
                    cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
            return
        directory = socket_dir()
        if not directory.is_dir():
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            for path in directory.glob("*.sock"):
                for payload in payloads:
                    try:
                        sock.sendto(payload.encode("ascii"), str(path))
                    except (ConnectionRefusedError, FileNotFoundError):
                        path.unlink(missing_ok=True)  # a process that is gone
                        break
                    except BlockingIOError:
                        break  # that process is swamped: its shards wait for their interval
    except Exception as exc:
        log.warning("could not notify shards of a change (they see it at their next heartbeat): %s", exc)


def shards_changed(shard_ids: Iterable[int | None]) -> None:
    """Within a transaction: once it commits, the shards' waits end and they heartbeat at once."""
    ids = {i for i in shard_ids if i is not None}
    if ids:
        payloads = encode(ids)
        transaction.on_commit(lambda: _send(payloads), robust=True)


def tokens_changed() -> None:
    """Within a transaction that changes a token, a user or a shard: every process's token cache is
    emptied. This process's at once and again at commit; the others' when they hear the news, which on
    PostgreSQL is sent in this transaction (delivered at its commit, with it, or never), on SQLite to each
    serving process's socket once it commits. Nothing is sent while the cache is off (no process keeps one)."""
    TOKEN_CACHE.invalidate()
    if not TOKEN_CACHE.enabled():
        return
    transaction.on_commit(TOKEN_CACHE.invalidate, robust=True)
    if _is_postgres():
        # Not caught: a change whose news cannot be sent must not commit, or other processes would
        # accept a revoked token for as long as they keep it.
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, TOKENS_PAYLOAD])
    else:
        transaction.on_commit(lambda: _send([TOKENS_PAYLOAD]), robust=True)


def _token_saved(sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    # A new row is in no cache (misses are not kept).
    if not created and _may_change_authentication(sender, update_fields):
        tokens_changed()


def _may_change_authentication(model: Any, update_fields: Any) -> bool:
    """Whether a save writing `update_fields` (None: all) may change what a cached token answers: not
    a login's last_login, a password (a token is not one), a token's last_used, nor any column of a
    shard but its hostname (the others change with each heartbeat and are never cached)."""
    if update_fields is None:
        return True
    fields = set(update_fields)
    if model is Shard:
        return "hostname" in fields
    return not fields <= {"last_login", "password", "last_used"}


def _token_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    tokens_changed()


for _model in (Token, get_user_model(), Shard):
    post_save.connect(_token_saved, sender=_model, dispatch_uid=f"token-cache-save-{_model._meta.label}")
    post_delete.connect(_token_deleted, sender=_model, dispatch_uid=f"token-cache-delete-{_model._meta.label}")
