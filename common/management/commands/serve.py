"""Serves this role over HTTP with gunicorn, the production WSGI server: the master, or a shard's own admin
(in common, so both roles have it)."""

import logging
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils.module_loading import import_string
from gunicorn.app.base import BaseApplication

from common.schema import check_migrated
from common.wsgi import application

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
STOP_WAIT_S = 10.0


def _start_background(worker: Any) -> None:
    """Starts the role's background threads in each worker, after the fork: threads do not survive
    a fork, and a database connection opened before it would be shared by two processes."""
    for path in settings.FLEETSHARD_SERVE_BACKGROUND:
        _background.append(import_string(path)())


def _stop_background(server: Any, worker: Any) -> None:
    for _, stop in _background:
        stop.set()
    for thread, _ in _background:
        thread.join(STOP_WAIT_S)


class Command(BaseCommand):
    help = "Serve this process's role over HTTP with gunicorn."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bind", default="127.0.0.1:8000", help="ADDRESS:PORT to listen on")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--threads", type=int, default=4)
        parser.add_argument("--timeout", type=int, default=60)

    def handle(self, *args: Any, **options: Any) -> None:
        check_migrated()
        if settings.SECRET_KEY == settings.DEV_SECRET_KEY:
            # Once, on stderr: the root logger (settings.LOGGING) writes there too, so logging it as
            # well printed it twice.
            print(
                "WARNING: SECRET_KEY is not set; using the development key. Never do this in production.",
                file=sys.stderr,
                flush=True,
            )
        _Gunicorn(
            {
                "bind": options["bind"],
                "workers": options["workers"],
                "threads": options["threads"],
                "timeout": options["timeout"],
                "accesslog": "-",
                "errorlog": "-",
                "loglevel": "info",
                "post_worker_init": _start_background,
                "worker_exit": _stop_background,
            }
        ).run()
