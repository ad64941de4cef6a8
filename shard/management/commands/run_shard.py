"""Runs the shard: the heartbeat client in a thread and the scheduler in the main thread, until a signal.

SIGTERM drains: no new work starts, running jobs get FLEETSHARD_DRAIN_S seconds to finish and are
then stopped as `infra` failures, and a last heartbeat carries their ends to the master. A second
SIGTERM, or a SIGINT, stops at once (SIGKILL to every run). Either way nothing is left running.
"""

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections, connection
from django.utils.module_loading import import_string

from common.models import OutboxEntry
from shard.client import HeartbeatClient, HeartbeatFailed, ProtocolRefused
from shard.executor import Executor
from shard.scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("shard.run_shard")

FINAL_HEARTBEATS = 3


class Command(BaseCommand):
    help = "Run this shard's heartbeat client and scheduler until SIGTERM (drain) or SIGINT (stop at once)."

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
        config = SchedulerConfig.from_settings()
        try:
            executor = import_string(settings.FLEETSHARD_EXECUTOR)()
        except (ImportError, TypeError) as exc:
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR}: {exc}") from exc
        if not isinstance(executor, Executor):
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR} is not a shard.executor.Executor")
        scheduler = Scheduler(config, executor)
        draining = threading.Event()
        at_once = threading.Event()
        wake = threading.Event()
        heartbeat_stop = threading.Event()
        fatal: list[str] = []

        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if signum == signal.SIGINT or draining.is_set():
                log.info("%s: stopping at once", name)
                at_once.set()
            else:
                log.info("%s: draining (no new work; %g s for running jobs)", name, settings.FLEETSHARD_DRAIN_S)
            draining.set()
            wake.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        def heartbeat() -> None:
            try:
                while not heartbeat_stop.is_set():
                    try:
                        client.run(heartbeat_stop)
                    except ProtocolRefused as exc:
                        fatal.append(str(exc))
                        at_once.set()
                        draining.set()
                        wake.set()
                        return
                    except Exception:
                        # A database hiccup must not end the heartbeat: log it and carry on.
                        log.exception("heartbeat failed unexpectedly; retrying")
                        heartbeat_stop.wait(1.0)
            finally:
                connection.close()

        log.info(
            "shard %s (runner %s) heartbeating to %s",
            settings.FLEETSHARD_SHARD_HOSTNAME,
            scheduler.runner_id,
            settings.FLEETSHARD_MASTER_URL,
        )
        thread = threading.Thread(target=heartbeat, name="heartbeat", daemon=True)
        thread.start()
        # No run, process or host is touched before the master accepts this database (docs/protocol.md,
        # "Shard instances"): a copy of a live shard's database must not start the work it holds.
        while not client.accepted.wait(config.tick_s) and not draining.is_set():
            pass
        if client.accepted.is_set():
            scheduler.recover()
        drain_deadline: float | None = None
        while client.accepted.is_set():
            if at_once.is_set():
                scheduler.stop_runs(at_once=True)
            elif draining.is_set():
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + settings.FLEETSHARD_DRAIN_S
                if time.monotonic() >= drain_deadline and scheduler.runs:
                    scheduler.stop_runs()
            try:
                # A connection broken by a database restart is dropped here and reopened by the next query.
                close_old_connections()
                scheduler.tick(start_new=not draining.is_set())
            except Exception:
                # Keep watching the runs already started rather than leave them unattended.
                log.exception("scheduler tick failed; retrying")
            settled = at_once.is_set() or not scheduler.busy or time.monotonic() >= (drain_deadline or 0)
            if draining.is_set() and not scheduler.runs and settled:
                break
            wake.wait(config.tick_s)
            wake.clear()
        scheduler.hosts.stop_all()
        heartbeat_stop.set()
        thread.join(timeout=settings.FLEETSHARD_REQUEST_TIMEOUT_S + 10)
        if not at_once.is_set():
            self._flush(client)
        if fatal:
            raise CommandError(f"stopping: {fatal[0]}")
        log.info("shard %s stopped", settings.FLEETSHARD_SHARD_HOSTNAME)

    def _flush(self, client: HeartbeatClient) -> None:
        """A last heartbeat or two so the master learns how the jobs ended; the outbox keeps the rest."""
        for _ in range(FINAL_HEARTBEATS):
            try:
                if not OutboxEntry.objects.exists():
                    return
                client.tick()
            except (HeartbeatFailed, DatabaseError) as exc:
                log.warning("final heartbeat failed (%s); the next start sends the rest", exc)
                return
