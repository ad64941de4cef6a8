"""Work slots under `serve`: a bounded number of requests work at once, each on a connection its slot lends."""

import threading
import time

import pytest
from django.db import connection, connections

from common import admission


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
    assert resp.status_code == 401  # a waiting path: the view takes its slot itself
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
