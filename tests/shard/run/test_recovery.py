"""Whether a scheduler process is alive decides whether its runs are closed and killed: only a
process that is really gone may count as dead."""

import os
import resource
import socket
import time
import uuid

import pytest

from shard.run.recovery import current_runner_id, runner_alive


def test_a_live_runner_stays_alive_when_proc_cannot_be_read_for_want_of_file_descriptors():
    me = current_runner_id()
    gone = f"{socket.gethostname()}:999999999:0"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        alive_without_descriptors = runner_alive(me)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert alive_without_descriptors
    assert runner_alive(me)
    assert not runner_alive(gone)


@pytest.mark.postgres_only(reason="a runner of another machine is known by its presence lock in PostgreSQL")
def test_a_runner_of_another_machine_is_alive_while_it_holds_its_presence_lock_then_after_a_grace_dead(db):
    from django.db import connections

    from shard.run.recovery import PRESENCE_GRACE_S, remote_runner_alive
    from shard.sync.leader import presence_key, runner_present
    from tests.support import wait_until

    runner = f"elsewhere-{uuid.uuid4().hex[:6]}:4242:99"
    other = connections.create_connection("default")  # the other machine's process: a session of its own
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [presence_key(runner)])
        assert runner_alive(runner)
        assert remote_runner_alive(runner, now=0.0)
    finally:
        other.close()
    # The server ends the other session (and frees its locks) a moment after the client closed it.
    wait_until(lambda: not runner_present(runner), timeout=10, interval=0.05, what="the lock to be freed")
    absent = time.monotonic() - 2 * PRESENCE_GRACE_S  # so that runner_alive's own clock is past the grace
    assert remote_runner_alive(runner, now=absent), "a connection being re-opened gets a grace"
    assert remote_runner_alive(runner, now=absent + PRESENCE_GRACE_S - 1)
    assert not remote_runner_alive(runner, now=absent + PRESENCE_GRACE_S)
    assert not runner_alive(runner)


def test_on_sqlite_a_runner_of_another_machine_is_assumed_alive(db, db_vendor):
    if db_vendor != "sqlite":
        pytest.skip("SQLite's rule; PostgreSQL knows better (the presence lock)")
    assert runner_alive("elsewhere:4242:99")
