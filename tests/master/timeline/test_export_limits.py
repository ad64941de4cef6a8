"""Streamed exports are bounded (issue 23): a few at once per user and per serving process (429 with
Retry-After beyond), and a deadline after which the stream ends, saying so, its snapshot released.
Before, 10 slow readers held 10 backends idle in transaction for as long as they read."""

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import psycopg2
import pytest
import requests
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.test import Client

from master.timeline import export, slices
from master.timeline.export import CUT_PID, trace_chunks
from master.timeline.limits import Deadline
from master.timeline.query import scope
from tests.master.timeline.factories import add_run, add_state, at
from tests.support import (
    Master,
    Role,
    assert_status,
    drop_database,
    free_port,
    fresh_database_url,
    serve,
    stop,
    using_postgres,
    wait_until,
)

URL = "/api/v1/timeline/export"


def signed_in(name: str) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(name, password="pw"))
    return client


def test_a_user_gets_429_with_retry_after_beyond_their_cap_and_a_slot_back_when_one_closes(fleet, settings):
    settings.FLEETSHARD_EXPORTS_PER_USER = 2
    settings.FLEETSHARD_EXPORTS_PER_PROCESS = 3
    settings.FLEETSHARD_EXPORT_DEADLINE_S = 120
    add_run("a1", 100, 400)
    ana, bob, cy = signed_in("ana"), signed_in("bob"), signed_in("cy")
    held = [ana.get(URL), ana.get(URL)]  # streamed, not read: they hold their slots
    assert [r.status_code for r in held] == [200, 200]
    refused = ana.get(URL)
    assert_status(refused, 429)
    assert "at most 2 per user" in refused.json()["error"]
    assert 100 <= int(refused["Retry-After"]) <= 120
    third = bob.get(URL)  # another user, while the process has room
    assert_status(third, 200)
    full = cy.get(URL)
    assert full.status_code == 429 and "3 per server process" in full.json()["error"]
    b"".join(held[0].streaming_content)  # read to its end, the response closes
    again = cy.get(URL)
    assert again.status_code == 200 and again["X-Fleetshard-Export-Deadline"] == "120"
    body = json.loads(b"".join(again.streaming_content))
    assert "otherData" not in body and any(e["ph"] == "X" for e in body["traceEvents"])
    for r in (held[1], third):
        b"".join(r.streaming_content)


def test_past_its_deadline_the_trace_ends_whole_and_says_so(fleet, monkeypatch):
    for n in range(30):
        add_state("a1", "Cleaning", n * 10, n * 10 + 5)
    monkeypatch.setattr(export, "FLUSH_CHARS", 1)
    deadline = Deadline(5, time.monotonic() + 3600, enforce_idle=False)
    chunks = trace_chunks(scope(at(1000)), deadline)
    first = next(chunks)
    deadline.at = time.monotonic()  # the reader took its time
    trace = json.loads(first + "".join(chunks))
    note = trace["otherData"]["cut_short"]
    assert note.startswith("export cut short: it reached its deadline of 5 s")
    assert {"pid": CUT_PID, "args": {"name": note}}.items() <= next(
        e for e in trace["traceEvents"] if e["name"] == "process_name" and e["pid"] == CUT_PID
    ).items()
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) < 30


def test_a_reader_gone_midway_leaves_the_connection_out_of_any_transaction(fleet_committed, monkeypatch):
    """Closing the stream in the middle of its slices (a reader gone, a deadline) left their atomic
    block and cursor open behind chain(): the connection stayed "in a transaction", and the orphan,
    collected later, rolled back whatever export the thread ran next ("named cursor isn't valid")."""
    for n in range(300):
        add_state("a1", "Cleaning", n * 10, n * 10 + 5)
    monkeypatch.setattr(slices, "CHUNK_ROWS", 10)
    monkeypatch.setattr(export, "FLUSH_CHARS", 100)
    chunks = trace_chunks(scope(at(100000)))
    while '"cat":"host"' not in next(chunks):
        pass
    assert connection.in_atomic_block
    chunks.close()
    assert not connection.in_atomic_block
    trace = json.loads("".join(trace_chunks(scope(at(100000)))))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 300


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("timeline-fetch") and t.is_alive()]


@pytest.mark.parametrize("pftrace_format", [False, True], ids=["chrome", "perfetto"])
def test_a_reader_gone_while_a_fetch_runs_ahead_waits_for_it_and_leaves_no_thread(
    fleet_committed, monkeypatch, pftrace_format
):
    """The slices' next fetch runs in a thread while a chunk leaves: a reader gone then closes the stream
    while the fetch may be under way. The cursor is closed only after it, no fetch thread is left, and
    the connection is out of any transaction and serves the next export whole."""
    from master.timeline import pftrace

    for n in range(300):
        add_state("a1", "Cleaning", n * 10, n * 10 + 5)
    monkeypatch.setattr(slices, "CHUNK_ROWS", 7)
    monkeypatch.setattr(export, "FLUSH_CHARS", 50)
    monkeypatch.setattr(pftrace, "FLUSH_BYTES", 50)
    for _ in range(3):
        chunks = (pftrace.pftrace_chunks if pftrace_format else trace_chunks)(scope(at(100000)))
        for _ in range(30):
            next(chunks)
        assert connection.in_atomic_block and len(_fetch_threads()) == 1  # amid the slices, a fetch ahead
        chunks.close()
        assert not connection.in_atomic_block and _fetch_threads() == []
    trace = json.loads("".join(trace_chunks(scope(at(100000)))))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 300
    assert _fetch_threads() == []


def test_an_error_in_the_fetch_thread_reaches_the_export_and_leaves_nothing_open(fleet_committed, monkeypatch):
    """A fetch that fails in the thread (the connection lost, say) fails the export with the database's
    error, before the deadline, as a fetch in the export's own thread did; nothing is left open."""
    for n in range(100):
        add_state("a1", "Cleaning", n * 10, n * 10 + 5)
    monkeypatch.setattr(slices, "CHUNK_ROWS", 5)
    monkeypatch.setattr(export, "FLUSH_CHARS", 50)
    real = connection.chunked_cursor
    fetches = []

    class Failing:
        """The export's real cursor, whose third fetch fails as a lost connection's would."""

        def __init__(self, cursor: object) -> None:
            self.cursor = cursor

        def __getattr__(self, name: str) -> object:
            return getattr(self.cursor, name)

        def fetchmany(self, size: int) -> object:
            fetches.append(threading.current_thread().name)
            if len(fetches) == 3:
                raise OperationalError("server closed the connection unexpectedly")
            return self.cursor.fetchmany(size)

    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.chunked_cursor = lambda: Failing(real())
    try:
        chunks = trace_chunks(scope(at(100000)), Deadline.starting_now(3600, enforce_idle=False))
        with pytest.raises(OperationalError, match="closed the connection"):
            for _ in chunks:
                pass
    finally:
        del wrapper.chunked_cursor
    assert len(fetches) == 3 and all(name.startswith("timeline-fetch") for name in fetches)
    assert not connection.in_atomic_block and _fetch_threads() == []
    trace = json.loads("".join(trace_chunks(scope(at(100000)))))
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 100


# Served: real slow readers on sockets, and PostgreSQL's own view of the backends.

pytestmark_pg = pytest.mark.skipif(
    not using_postgres(), reason="snapshots and idle-in-transaction backends are PostgreSQL's (pg_stat_activity)"
)
DEADLINE_S = 8


@pytest.fixture(scope="module")
def bounded_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Master, str]]:
    """One worker (one process's cap), 2 exports per user, 3 per process, an 8 s deadline, and a fleet
    whose trace (about 6 MB) outlasts every socket buffer."""
    data_dir = tmp_path_factory.mktemp("bounded")
    url = fresh_database_url(data_dir, "bounded")
    env = {
        "FLEETSHARD_EXPORTS_PER_USER": "2",
        "FLEETSHARD_EXPORTS_PER_PROCESS": "3",
        "FLEETSHARD_EXPORT_DEADLINE_S": str(DEADLINE_S),
        # Its day is long over: built, it would leave in a few large pieces, not the chunks of a read.
        "FLEETSHARD_TRACE_DAYS_IN_SERVE": "0",
    }
    role = Role("master", url, data_dir, env)
    role.manage("migrate", "--noinput")
    tokens = role.shell(
        """
from datetime import UTC, datetime, timedelta
from common.models import Host, Shard
from master.services import create_personal_token
from master.timeline.models import Interval
shard = Shard.objects.create(hostname="lab1")
hosts = Host.objects.bulk_create([Host(hostname=f"h{i}", shard=shard) for i in range(20)])
t0 = datetime(2026, 11, 1, tzinfo=UTC)
Interval.objects.bulk_create(
    [Interval(kind="cleaning", host=hosts[i % 20], shard=shard, start=t0 + timedelta(seconds=i),
              end=t0 + timedelta(seconds=i, milliseconds=500)) for i in range(40000)],
    batch_size=5000,
)
result = [create_personal_token(n, acting_user=None)[1] for n in ("ana", "bob", "cy")]
"""
    )
    port = free_port()
    master = Master(role, f"http://127.0.0.1:{port}", serve(role, port))
    yield master, url, tokens
    stop(master.proc)
    drop_database(url)


def slow_reader(master: Master, token: str) -> tuple[socket.socket, bytes]:
    """An export's reader that takes a few KiB now and then: never idle long enough to be cut off as
    stalled, never done."""
    port = int(master.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {URL}?since=2026-10-01 HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    assert head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")), head[:300]
    return sock, head.split(b"\r\n\r\n", 1)[1]


def backends(url: str) -> dict[str, int]:
    """The master database's client backends by state (psycopg2's own connection left out)."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT state, count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY state"
        )
        return dict(cur.fetchall())


@pytestmark_pg
def test_slow_readers_are_capped_and_their_snapshots_end_at_the_deadline(bounded_master):
    master, url, (ana, bob, cy) = bounded_master
    pre = requests.get(master.url + URL, headers={"Authorization": f"Token {ana}"}, timeout=60)
    assert pre.status_code == 200 and "otherData" not in pre.json()
    got = dict(slow_reader(master, token) for token in (ana, ana, bob))
    readers = list(got)
    began = time.monotonic()
    try:
        for sock in readers:
            got[sock] += sock.recv(4096)
        refused = requests.get(master.url + URL, headers={"Authorization": f"Token {ana}"}, timeout=10)
        assert refused.status_code == 429 and "at most 2 per user" in refused.json()["error"]
        assert 1 <= int(refused.headers["Retry-After"]) <= DEADLINE_S
        full = requests.get(master.url + URL, headers={"Authorization": f"Token {cy}"}, timeout=10)
        assert full.status_code == 429 and "3 per server process" in full.json()["error"]
        # Each reader's snapshot, held while its socket is full (one may still be fetching a moment).
        assert wait_until(lambda: backends(url).get("idle in transaction", 0) == 3, timeout=5)

        def ended() -> bool:
            return backends(url).get("idle in transaction", 0) == 0

        def trickle_until(t: float, done: Callable[[], bool]) -> None:
            while time.monotonic() < t and not done():
                for sock in readers:
                    got[sock] += sock.recv(2048)
                time.sleep(0.3)

        # Still reading the same chunks, slowly: PostgreSQL ended their transactions at the deadline. Looked
        # at from 2 s past it until 10 s past it: a loaded machine may end them a moment later, not never.
        trickle_until(began + DEADLINE_S + 2, lambda: False)
        trickle_until(began + DEADLINE_S + 10, ended)
        assert ended()
        # Read to the end now: each trace is whole JSON, cut short, and says so.
        for sock in readers:
            sock.settimeout(30)
            while chunk := sock.recv(1 << 16):
                got[sock] += chunk
            body = json.loads(got[sock])
            assert body["otherData"]["cut_short"].startswith(
                f"export cut short: it reached its deadline of {DEADLINE_S} s"
            )
            assert sum(e["ph"] == "X" for e in body["traceEvents"]) < 40000
    finally:
        for sock in readers:
            sock.close()
    assert wait_until(lambda: backends(url).get("idle in transaction", 0) == 0, timeout=10)
    ok = requests.get(master.url + URL, headers={"Authorization": f"Token {ana}"}, timeout=60)
    assert ok.status_code == 200 and "otherData" not in ok.json()
    assert sum(e["ph"] == "X" for e in ok.json()["traceEvents"]) == 40000
