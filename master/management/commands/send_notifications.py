"""Sends notifications, for a master whose `serve` workers do not (FLEETSHARD_NOTIFY_IN_SERVE=0), or
once from cron or by hand (--once). Only one sender works at a time across all masters."""

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.schema import check_migrated
from master.notify.sender import Sender


class Command(BaseCommand):
    help = "Deliver notifications from the outbox: until stopped, or --once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="send what is due now, then exit")
        parser.add_argument("--timeout", type=float, default=60.0, help="with --once: give up after this many seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "master":
            raise CommandError("send_notifications needs FLEETSHARD_ROLE=master")
        check_migrated()
        sender = Sender()
        if options["once"]:
            if not sender.lock.acquire():
                raise CommandError("another sender holds the lock (a served master, or send_notifications)")
            try:
                sender.drain(options["timeout"])
            finally:
                sender.close()
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        sender.run(stop)
