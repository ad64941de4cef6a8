"""Work slots under `serve`: a bounded number of requests work at once, each on a connection its slot lends."""

import threading
import time

import pytest
from django.db import connection, connections

from common import admission
from tests.support import assert_status


@pytest.fixture
def two_slots(transactional_db):
    admission.limit_work(2)
    yield
    pool = admission._slots
    admission._slots = None
    while pool is not None and not pool.empty():
        for wrapper in pool.get().values():
            wrapper.close()


def test_many_threads_work_two_at_a_time_on_the_two_connections_the_slots_lend(two_slots):
    busy, most, seen, own = 0, 0, set(), []
    lock = threading.Lock()

    def work() -> None:
        nonlocal busy, most
        with admission.work_slot():
            with lock:
                busy += 1
                most = max(most, busy)
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
            seen.add(id(connections["default"]))
            time.sleep(0.02)
            with lock:
                busy -= 1
        # Outside a slot the thread holds no connection of its own.
        if connection.connection is not None:
            own.append(threading.get_ident())

    threads = [threading.Thread(target=work) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most == 2
    assert len(seen) == 2
    assert own == []


def test_a_request_through_the_middleware_works_in_a_slot(two_slots, client):
    resp = client.get("/api/v1/heartbeat/wait", {"timeout": "0"})
    assert_status(resp, 401)
    assert client.get("/metrics").status_code in (401, 403)
    assert admission._slots is not None and admission._slots.qsize() == 2


def test_what_a_streamed_response_opens_after_its_slot_closes_with_it(two_slots):
    from django.core.signals import request_finished

    opened: list[bool] = []

    def after_the_slot() -> None:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        opened.append(connection.connection is not None)
        request_finished.send(sender=None)
        opened.append(connection.connection is not None)

    thread = threading.Thread(target=after_the_slot)
    thread.start()
    thread.join(10)
    assert opened == [True, False]


# common/admission.py lends connections between threads through parts of django.db that are not public
# API: BaseDatabaseWrapper.inc_thread_sharing, and assigning / deleting connections[alias] (the
# handler's thread-local). These tests fail, loudly, on a Django where those parts change; the Django pin
# in pyproject.toml says to run them before an upgrade.
LENDING_CHECKED_ON = "5.2.19"


def test_django_is_the_version_whose_private_connection_parts_were_checked():
    import tomllib

    import django

    from tests.support import ROOT

    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"Django=={LENDING_CHECKED_ON}" in pins
    assert django.__version__ == LENDING_CHECKED_ON, (
        f"Django {django.__version__}: check that common/admission.py's connection lending still works "
        f"(the tests below), then set LENDING_CHECKED_ON"
    )


def test_a_lent_connection_works_in_another_thread_and_only_there(transactional_db):
    """The private parts admission relies on, as it uses them: a connection made in one thread and
    marked shared is used by another after `connections[alias] = wrapper`, is that thread's
    `connection` only, and goes from it with `del connections[alias]`."""
    from django.db import DatabaseError
    from django.db.backends.base.base import BaseDatabaseWrapper

    for name in ("inc_thread_sharing", "dec_thread_sharing", "validate_thread_sharing", "allow_thread_sharing"):
        assert hasattr(BaseDatabaseWrapper, name), f"django.db lost BaseDatabaseWrapper.{name}"
    wrapper = connections.create_connection("default")
    outcome: dict[str, object] = {}

    def unshared() -> None:
        try:
            wrapper.validate_thread_sharing()
        except DatabaseError:
            outcome["refused"] = True

    thread = threading.Thread(target=unshared)
    thread.start()
    thread.join()
    assert outcome.get("refused"), "a connection not marked shared must be refused in another thread"
    wrapper.inc_thread_sharing()
    try:

        def borrower() -> None:
            connections["default"] = wrapper
            try:
                outcome["same"] = connections["default"] is wrapper and connection.connection is wrapper.connection
                with connection.cursor() as cur:
                    cur.execute("SELECT 1")
                    outcome["row"] = cur.fetchone()
            finally:
                del connections["default"]
            outcome["gone"] = connections["default"] is not wrapper

        thread = threading.Thread(target=borrower)
        thread.start()
        thread.join()
        assert outcome == {"refused": True, "same": True, "row": (1,), "gone": True}
        assert connections["default"] is not wrapper, "the lending thread's own connection must be untouched"
    finally:
        wrapper.close()
