"""How many requests a serving process works on at once, long-polls apart.

`serve` gives gunicorn's thread pool two kinds of threads: `--threads` that work, and `--waits` more
for long-polls, which hold a thread while they wait but no database connection. A request works only
once it has one of the `--threads` slots, so the long-polls' threads never add database connections
or concurrent work; a long-poll takes a slot only while it authenticates. Persistent database
connections stay with at most as many threads as there are slots: a thread past that closes its own
when it gives its slot back. Outside `serve` (tests, runserver) nothing is limited.
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection
from django.http import HttpRequest, HttpResponse

# The paths whose views take a slot themselves, only for as long as they use the database.
WAITING_PATHS = frozenset({"/api/v1/heartbeat/wait"})

_slots: threading.BoundedSemaphore | None = None
_limit = 0
_holders: set[int] = set()
_holders_lock = threading.Lock()


def limit_work(slots: int) -> None:
    """Called by `serve` in each worker: at most `slots` requests work at once."""
    global _slots, _limit
    _slots = threading.BoundedSemaphore(slots)
    _limit = slots


@contextmanager
def work_slot() -> Iterator[None]:
    """Holds one of the process's slots while the database is used."""
    if _slots is None:
        yield
        return
    with _slots:
        try:
            yield
        finally:
            _keep_or_close_connection()


def _keep_or_close_connection() -> None:
    ident = threading.get_ident()
    with _holders_lock:
        if connection.connection is None:
            _holders.discard(ident)
        elif ident in _holders or len(_holders) < _limit:
            _holders.add(ident)
            return
    if connection.connection is not None:
        connection.close()


class AdmissionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _slots is None or request.path_info in WAITING_PATHS:
            return self.get_response(request)
        with work_slot():
            return self.get_response(request)
