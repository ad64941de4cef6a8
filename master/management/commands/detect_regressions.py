"""Runs the regression detector on the series uploads marked, for a master whose `serve` workers do
not (FLEETSHARD_DETECT_IN_SERVE=0), or once from cron or by hand (--once)."""

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.schema import check_migrated
from master.results.detection import INTERVAL_S, drain, run_detector


class Command(BaseCommand):
    help = "Look for regressions in the series uploads touched: until stopped, or --once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="drain what is marked now, then exit")
        parser.add_argument(
            "--interval", type=float, default=INTERVAL_S, help="seconds between looks when idle (default 1)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "master":
            raise CommandError("detect_regressions needs FLEETSHARD_ROLE=master")
        check_migrated()
        if options["interval"] <= 0:
            raise CommandError(f"--interval must be positive, got {options['interval']}")
        if options["once"]:
            self.stdout.write(f"{drain()} series read")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        run_detector(stop, options["interval"])
