"""Builds the timeline's closed days (master/timeline/days.py) for a master whose `serve` workers do
not (FLEETSHARD_TRACE_DAYS_IN_SERVE=0), or once from cron or by hand (--once)."""

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.schema import check_migrated
from master.timeline.days import INTERVAL_S, build_due, run_builder


class Command(BaseCommand):
    help = "Build the timeline's closed days for the export: until stopped, or --once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="build every day due now, then exit")
        parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between passes (default 60)")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "master":
            raise CommandError("build_trace_days needs FLEETSHARD_ROLE=master")
        check_migrated()
        if options["interval"] <= 0:
            raise CommandError(f"--interval must be positive, got {options['interval']}")
        if options["once"]:
            total, left = 0, 1
            while left:
                built, left = build_due()
                total += built
                if not built:  # every day of the pass failed (logged): the next run tries again
                    break
            self.stdout.write(f"{total} days built")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        run_builder(stop, options["interval"])
