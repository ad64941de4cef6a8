"""Serves this role over HTTP with gunicorn, the production WSGI server: the master, or a shard's own admin
(in common, so both roles have it).

gunicorn's threaded workers get `--threads` threads that work and `--waits` more that only hold
long-polls (common/admission.py): thousands of waiting shards cost threads blocked on one event each,
not database connections, and never take the place of a heartbeat.
"""

import gc
import logging
import os
import signal
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.utils.module_loading import import_string
from gunicorn.app.base import BaseApplication

from common.admission import limit_work
from common.schema import check_migrated
from server.serve_worker import OWN_FILES, connection_budget
from server.wsgi import application

log = logging.getLogger("common.serve")


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return application


# The worker's background threads and their stop events (settings.FLEETSHARD_SERVE_BACKGROUND).
_background: list[tuple[threading.Thread, threading.Event]] = []
_work_threads = 4
STOP_WAIT_S = 10.0


def _start_background(worker: Any) -> None:
    """Starts the role's background threads in each worker, after the fork: threads do not survive
    a fork, and a database connection opened before it would be shared by two processes."""
    limit_work(_work_threads)
    for path in settings.FLEETSHARD_SERVE_BACKGROUND:
        _background.append(import_string(path)())
    # gunicorn waits for a stopping worker's requests: held long-polls end as their listener stops,
    # so a restart takes a moment, not the longest wait.
    graceful = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        for _, stop in _background:
            stop.set()
        if callable(graceful):
            graceful(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
    # What the worker has loaded lives as long as it does: frozen, it is no longer scanned by the full
    # collections that the objects of each request's parsed body set off (a fifteenth of a heartbeat's time).
    gc.freeze()


def _stop_background(server: Any, worker: Any) -> None:
    for _, stop in _background:
        stop.set()
    for thread, _ in _background:
        thread.join(STOP_WAIT_S)


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise CommandError(f"{name} must be a whole number of at least 1, not {value!r}")
    return number


# The database connections all of serve's workers may hold by default: PostgreSQL's default
# max_connections (100) less 20 for migrations, commands, `detect_regressions` and a person's psql.
DEFAULT_DB_CONNECTIONS = 80


def db_connection_budget() -> int:
    env = os.environ.get("FLEETSHARD_SERVE_DB_CONNECTIONS", "").strip()
    return _positive("FLEETSHARD_SERVE_DB_CONNECTIONS", env) if env else DEFAULT_DB_CONNECTIONS


def connections_per_worker(threads: int) -> int:
    """What one worker may hold: a connection per working thread (common/admission.py), per background
    thread (the listener, the detector) and per streamed export (master/timeline/limits.py)."""
    return threads + len(settings.FLEETSHARD_SERVE_BACKGROUND) + getattr(settings, "FLEETSHARD_EXPORTS_PER_PROCESS", 0)


def default_workers(threads: int = 4, cores: int | None = None) -> int:
    """WEB_CONCURRENCY when set (the convention of gunicorn and PaaS hosts), else two per core plus one,
    as many as fit in the database connections' budget (FLEETSHARD_SERVE_DB_CONNECTIONS, 80): from 16
    cores on, 33 workers of 4 threads alone would want more than PostgreSQL's default 100."""
    env = os.environ.get("WEB_CONCURRENCY", "").strip()
    if env:
        return _positive("WEB_CONCURRENCY", env)
    per_core = 2 * (cores or os.cpu_count() or 1) + 1
    return max(1, min(per_core, db_connection_budget() // connections_per_worker(threads)))


def _max_connections() -> int | None:
    """PostgreSQL's max_connections; None on SQLite or while the database is unreachable (serve
    starts anyway, as check_migrated lets it, and /readyz says so)."""
    if connection.vendor != "postgresql":
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW max_connections")
            return int(cursor.fetchone()[0])
    except DatabaseError:
        return None


def default_threads() -> int:
    env = os.environ.get("FLEETSHARD_SERVE_THREADS", "").strip()
    return _positive("FLEETSHARD_SERVE_THREADS", env) if env else 4


class Command(BaseCommand):
    help = "Serve this process's role over HTTP with gunicorn."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000", help="ADDRESS:PORT to listen on")
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="processes [env WEB_CONCURRENCY; default 2 per core + 1, within FLEETSHARD_SERVE_DB_CONNECTIONS]",
        )
        parser.add_argument(
            "--threads", type=int, default=None, help="threads per process [env FLEETSHARD_SERVE_THREADS; 4]"
        )
        parser.add_argument(
            "--waits", type=int, default=1000, help="long-polls each worker holds at once, beside --threads"
        )
        parser.add_argument("--timeout", type=int, default=60)

    def handle(self, *args: Any, **options: Any) -> None:
        global _work_threads
        threads = options["threads"] if options["threads"] is not None else default_threads()
        workers = options["workers"] if options["workers"] is not None else default_workers(threads)
        for name, value in (("workers", workers), ("threads", threads)):
            if value < 1:
                raise CommandError(f"--{name} must be at least 1")
        if options["waits"] < 0:
            raise CommandError("--waits must be at least 0")
        check_migrated()
        _work_threads = threads
        settings.FLEETSHARD_LONGPOLL_MAX_WAITS = options["waits"]
        json_logs = settings.LOG_FORMAT == "json"
        if settings.SECRET_KEY == settings.DEV_SECRET_KEY:
            msg = "WARNING: SECRET_KEY is not set; using the development key. Never do this in production."
            # Once: in JSON as a log line, else on stderr (the root logger writes there too, so both
            # printed it twice).
            if json_logs:
                log.warning(msg)
            else:
                print(msg, file=sys.stderr, flush=True)
        wanted = workers * connections_per_worker(threads)
        limit = _max_connections()
        connection.close()  # not to be inherited by the workers
        summary = f"serve: {workers} workers x {connections_per_worker(threads)} database connections = {wanted}"
        if limit is not None and wanted > limit:
            log.warning(
                "%s, more than PostgreSQL's max_connections (%d): lower --workers or --threads, or raise it",
                summary,
                limit,
            )
        else:
            log.info("%s%s", summary, f" (PostgreSQL's max_connections: {limit})" if limit is not None else "")
        budget = connection_budget(threads + options["waits"])
        if budget < threads + options["waits"]:
            raise CommandError(
                f"--threads {threads} and --waits {options['waits']} need more open files than this process "
                f"may have ({budget + OWN_FILES}, ulimit -n); raise the limit or ask for fewer waits"
            )
        gunicorn_options: dict[str, Any] = {
            "bind": options["bind"],
            "workers": workers,
            "worker_class": "server.serve_worker.PollingThreadWorker",
            "threads": threads + options["waits"],
            "worker_connections": budget,
            "timeout": options["timeout"],
            "accesslog": "-",
            "errorlog": "-",
            "loglevel": "info",
            # gunicorn's control socket is one path per user ($HOME/.gunicorn/gunicorn.ctl): a second
            # serve on the machine (a shard's admin, another master) would take it over. Nothing uses it.
            "control_socket_disable": True,
            "post_worker_init": _start_background,
            "worker_exit": _stop_background,
        }
        if json_logs:
            gunicorn_options["logger_class"] = "common.logjson.GunicornJsonLogger"
        _Gunicorn(gunicorn_options).run()
