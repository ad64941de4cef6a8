"""HeartbeatLeadership's lock against a killed connection, in one process with two leaderships: the old
holder stops before the new one starts, so the shard never has two heartbeaters."""

import threading
import time

import pytest
from django.db import connection

from shard.leader import HeartbeatLeadership, lock_key
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
