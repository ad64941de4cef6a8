"""HeartbeatLeadership's lock against a killed connection, in one process with two leaderships: the old
holder stops before the new one starts, so the shard never has two heartbeaters."""

import threading
import time

import pytest
from django.db import connection

from shard.sync.leader import HeartbeatLeadership, lock_key, presence_key, runner_present
from tests.support import wait_until

pytestmark = pytest.mark.postgres_only(reason="the heartbeat lock is a PostgreSQL advisory lock")


def test_a_holder_whose_connection_is_killed_stops_before_another_takes_over(db):
    stop = threading.Event()
    key = lock_key(f"leadership-test-{time.time_ns()}")
    # The old holder looks at its lock rarely, the other tries often: the worst case for an overlap.
    old = HeartbeatLeadership(stop, 3.0, key=key, what="old")
    new = HeartbeatLeadership(stop, 0.05, key=key, what="new")
    both: list[float] = []

    def watch() -> None:
        while not stop.is_set():
            if old.held.is_set() and new.held.is_set():
                both.append(time.monotonic())
            time.sleep(0.005)

    try:
        old.start()
        assert old.wait_held(10)
        new.start()
        wait_until(new.follows.is_set, timeout=10, interval=0.02, what="the other to follow")
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        pid = old._conn.connection.info.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert new.wait_held(10), "nobody took the heartbeat over"
        assert not old.held.is_set()
        assert old.lost.is_set()
        assert both == [], "two processes held the heartbeat at once"
        # The old one reconnects and follows (its presence and its next try need a live thread).
        wait_until(old.follows.is_set, timeout=10, interval=0.05, what="the old holder to follow")
        assert old._thread is not None and old._thread.is_alive()
    finally:
        stop.set()


def test_the_locks_of_a_process_whose_machine_vanished_go_within_a_minute_not_hours(db):
    """A worker's node that loses power never closes its connections: PostgreSQL then keeps its locks
    (the heartbeat, its presence) until TCP keepalive gives up, two hours by default. Every connection
    (the leadership's is made from the same settings) asks for probes after 10 s idle, 3 of them 5 s apart."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_client_addr() IS NOT NULL")
        if not cursor.fetchone()[0]:
            pytest.skip("keepalives apply to TCP connections; this database is on a Unix socket")
        settings = []
        for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"):
            cursor.execute(f"SHOW {name}")
            settings.append(cursor.fetchone()[0])
    assert settings == ["10", "5", "3"]


def test_a_presence_lock_that_cannot_be_had_gives_up_within_its_bound_and_is_tried_again(db, monkeypatch):
    """The presence lock held elsewhere (a partitioned worker's own previous backend, still alive on the
    server): the re-lock waits LOCK_WAIT_S, not for ever, so the process can stop and tries again later."""
    from shard.sync import leader

    monkeypatch.setattr(leader, "LOCK_WAIT_S", 0.5, raising=False)
    runner = f"partitioned-{time.time_ns()}"
    key = lock_key(f"leadership-test-{time.time_ns()}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [presence_key(runner)])
    # Told to stop while the lock cannot be had: it stops within the bound.
    stop = threading.Event()
    stuck = HeartbeatLeadership(stop, 0.2, key=key, what="partitioned", presence=runner)
    stuck.start()
    time.sleep(1.0)
    assert not stuck.held.is_set()
    stop.set()
    began = time.monotonic()
    assert stuck._thread is not None
    stuck._thread.join(10)
    # LOCK_WAIT_S and room for a loaded machine: the bug was a wait for ever.
    assert not stuck._thread.is_alive() and time.monotonic() - began < 0.5 + 3.0
    # Left running, it tries again and takes the lock once it is free.
    stop = threading.Event()
    leadership = HeartbeatLeadership(stop, 0.2, key=key, what="partitioned", presence=runner)
    leadership.start()
    try:
        time.sleep(1.5)
        assert not leadership.held.is_set()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [presence_key(runner)])
        assert leadership.wait_held(5), "the lock was not tried again once free"
        assert runner_present(runner) is True
    finally:
        stop.set()


def test_a_holder_whose_connection_goes_silent_lets_go_within_its_bound(db, monkeypatch):
    """A partition, not a kill: nothing closes the lock's connection, so only a bounded round trip
    tells the holder it may no longer hold the heartbeat; it then connects again and follows or holds."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    from shard.sync import leader
    from tests.support import SilentDropProxy

    monkeypatch.setattr(leader, "ROUND_TRIP_S", 0.5, raising=False)
    proxy = SilentDropProxy(int(connection.settings_dict["PORT"] or 5432))
    connection.ensure_connection()
    params = DatabaseWrapper.get_connection_params
    monkeypatch.setattr(DatabaseWrapper, "get_connection_params", lambda w: params(w) | {"port": proxy.port})
    stop = threading.Event()
    leadership = HeartbeatLeadership(stop, 0.2, key=lock_key(f"leadership-test-{time.time_ns()}"), what="silent")
    leadership.start()
    try:
        assert leadership.wait_held(10)
        proxy.drop()
        began = time.monotonic()
        wait_until(leadership.lost.is_set, timeout=10, interval=0.02, what="the holder to let go")
        # ROUND_TRIP_S and room for a loaded machine; unbounded, a silent connection is never let go.
        assert time.monotonic() - began < 0.5 + 3.0
    finally:
        stop.set()
        assert leadership._thread is not None
        leadership._thread.join(5)
        proxy.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )
    assert not leadership._thread.is_alive()
