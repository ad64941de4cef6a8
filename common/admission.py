"""How many requests a serving process works on at once, long-polls apart, and their database connections.

`serve` gives gunicorn's thread pool two kinds of threads: `--threads` that work, and `--waits` more
for long-polls, which hold a thread while they wait but no database connection. A request works only
once it holds one of the `--threads` slots, and each slot lends it one database connection that the
slot keeps (persistent, as CONN_MAX_AGE says) from request to request, whichever thread runs it. So
the process keeps exactly `--threads` connections however many threads gunicorn has started, and the
long-polls never add connections or concurrent work: a long-poll takes a slot only while it
authenticates. Outside `serve` (tests, runserver) nothing is limited or lent.

Django has no public API for handing a connection to another thread: the lending uses
`inc_thread_sharing` and assigns `connections[alias]`. tests/common/test_admission.py checks both
on the pinned Django and fails, naming this module, on any other version.
"""

import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from django.core.signals import request_finished
from django.db import connections
from django.http import HttpRequest, HttpResponse

# The paths whose views take a slot themselves, only for as long as they use the database.
WAITING_PATHS = frozenset({"/api/v1/heartbeat/wait"})

_slots: "queue.LifoQueue[dict[str, Any]] | None" = None


def limit_work(slots: int) -> None:
    """Called by `serve` in each worker, after the fork: at most `slots` requests work at once."""
    global _slots
    pool: queue.LifoQueue[dict[str, Any]] = queue.LifoQueue()
    for _ in range(slots):
        wrappers = {}
        for alias in connections:
            wrapper = connections.create_connection(alias)
            wrapper.inc_thread_sharing()  # lent to one thread at a time
            wrappers[alias] = wrapper
        pool.put(wrappers)
    _slots = pool
    request_finished.connect(_close_own_connections, dispatch_uid="common.admission")


def _close_own_connections(**kwargs: Any) -> None:
    """A streamed response runs after its slot: what it opened in this thread closes with the response."""
    if _slots is None:
        return
    for own in connections.all(initialized_only=True):
        own.close()


@contextmanager
def work_slot() -> Iterator[None]:
    """Holds one of the process's slots, and its database connections, while the database is used."""
    if _slots is None:
        yield
        return
    wrappers = _slots.get()
    try:
        # A connection this thread opened on its own (after a slot, in a streamed response) goes.
        for own in connections.all(initialized_only=True):
            if own not in wrappers.values():
                own.close()
        for alias, wrapper in wrappers.items():
            wrapper.close_if_unusable_or_obsolete()
            connections[alias] = wrapper
        yield
    finally:
        for alias, wrapper in wrappers.items():
            with suppress(AttributeError):
                del connections[alias]
            wrapper.close_if_unusable_or_obsolete()
        _slots.put(wrappers)


class AdmissionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _slots is None or request.path_info in WAITING_PATHS:
            return self.get_response(request)
        with work_slot():
            return self.get_response(request)
