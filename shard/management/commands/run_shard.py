"""Runs the shard: the heartbeat client (and the scheduler, when present) until SIGTERM."""

import logging
import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from shard.client import HeartbeatClient, ProtocolRefused

log = logging.getLogger("shard.run_shard")


class Command(BaseCommand):
    help = "Run this shard's heartbeat client until SIGTERM."

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "shard":
            raise CommandError("run_shard needs FLEETSHARD_ROLE=shard")
        missing = [
            name
            for name, value in (
                ("FLEETSHARD_MASTER_URL", settings.FLEETSHARD_MASTER_URL),
                ("FLEETSHARD_SHARD_HOSTNAME", settings.FLEETSHARD_SHARD_HOSTNAME),
                ("FLEETSHARD_SHARD_TOKEN", settings.FLEETSHARD_SHARD_TOKEN),
            )
            if not value
        ]
        if missing:
            raise CommandError(f"set {', '.join(missing)} to run a shard")
        client = HeartbeatClient(
            settings.FLEETSHARD_MASTER_URL, settings.FLEETSHARD_SHARD_HOSTNAME, settings.FLEETSHARD_SHARD_TOKEN
        )
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %s: finishing the current tick, then stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("shard %s heartbeating to %s", settings.FLEETSHARD_SHARD_HOSTNAME, settings.FLEETSHARD_MASTER_URL)
        try:
            client.run(stop)
        except ProtocolRefused as exc:
            raise CommandError(f"stopping: {exc}") from exc
        log.info("shard %s stopped", settings.FLEETSHARD_SHARD_HOSTNAME)
