"""Runs the shard: the heartbeat client in a thread and the scheduler in the main thread, until a signal.

SIGTERM drains: no new work starts, running jobs get FLEETSHARD_DRAIN_S seconds to finish and are
then stopped as `infra` failures, and a last heartbeat carries their ends to the master. A second
SIGTERM, or a SIGINT, stops at once (SIGKILL to every run). Either way nothing is left running.
"""

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections, connection
from django.utils.module_loading import import_string

from shard.client import HeartbeatClient, HeartbeatFailed, ProtocolRefused
from shard.executor import Executor
from shard.isolation import (
    IsolationError,
    JobUser,
    describe_job_user,
    hide_environ,
    make_traversable,
    protect_data,
    read_token_file,
)
from shard.models import OutboxEntry
from shard.scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("shard.run_shard")

FINAL_HEARTBEATS = 3


# Once every process of the runs is gone, how long the loop still tries to record their ends before
# it exits anyway (a database that fails every query must not keep a stopping shard alive).
RECORD_GRACE_S = 5.0


def shard_token(user: JobUser | None) -> str:
    """The shard's token: from FLEETSHARD_SHARD_TOKEN_FILE (which jobs cannot read) or FLEETSHARD_SHARD_TOKEN."""
    if settings.FLEETSHARD_SHARD_TOKEN_FILE:
        if settings.FLEETSHARD_SHARD_TOKEN:
            raise CommandError("set FLEETSHARD_SHARD_TOKEN_FILE or FLEETSHARD_SHARD_TOKEN, not both")
        try:
            return read_token_file(Path(settings.FLEETSHARD_SHARD_TOKEN_FILE), user)
        except IsolationError as exc:
            raise CommandError(str(exc)) from exc
    return settings.FLEETSHARD_SHARD_TOKEN


def sqlite_file() -> list[Path]:
    db = settings.DATABASES["default"]
    return [Path(db["NAME"])] if db["ENGINE"].endswith("sqlite3") else []


class Command(BaseCommand):
    help = "Run this shard's heartbeat client and scheduler until SIGTERM (drain) or SIGINT (stop at once)."

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "shard":
            raise CommandError("run_shard needs FLEETSHARD_ROLE=shard")
        try:
            config = SchedulerConfig.from_settings()
        except (IsolationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        token = shard_token(config.job_user)
        missing = [
            name
            for name, value in (
                ("FLEETSHARD_MASTER_URL", settings.FLEETSHARD_MASTER_URL),
                ("FLEETSHARD_SHARD_HOSTNAME", settings.FLEETSHARD_SHARD_HOSTNAME),
                ("FLEETSHARD_SHARD_TOKEN", token),
            )
            if not value
        ]
        if missing:
            raise CommandError(f"set {', '.join(missing)} to run a shard")
        client = HeartbeatClient(settings.FLEETSHARD_MASTER_URL, settings.FLEETSHARD_SHARD_HOSTNAME, token)
        try:
            executor = import_string(settings.FLEETSHARD_EXECUTOR)()
        except (ImportError, TypeError) as exc:
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR}: {exc}") from exc
        if not isinstance(executor, Executor):
            raise CommandError(f"FLEETSHARD_EXECUTOR={settings.FLEETSHARD_EXECUTOR} is not a shard.executor.Executor")
        try:
            protect_data(settings.DATA_DIR, sqlite_file())
            make_traversable(config.results_root, config.job_user)
            tracking = executor.describe()
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot prepare the shard's files: {exc}") from exc
        if config.job_user is None and not hide_environ():
            log.warning("cannot hide this process's environment from jobs of its own user (prctl unavailable)")
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
        log.info("%s; %s", describe_job_user(config.job_user), tracking)
        thread = threading.Thread(target=heartbeat, name="heartbeat", daemon=True)
        thread.start()
        if self._wait_for_acceptance(client, draining, wake, config.tick_s):
            self._loop(scheduler, config, draining, at_once, wake)
        scheduler.hosts.stop_all()
        # Nothing of ours may outlive us, and our empty cgroups go too.
        executor.kill_runner(scheduler.runner_id)
        heartbeat_stop.set()
        thread.join(timeout=2 if at_once.is_set() else settings.FLEETSHARD_REQUEST_TIMEOUT_S + 10)
        if not at_once.is_set() and not thread.is_alive():
            self._flush(client)
        if fatal:
            raise CommandError(f"stopping: {fatal[0]}")
        log.info("shard %s stopped", settings.FLEETSHARD_SHARD_HOSTNAME)

    @staticmethod
    def _wait_for_acceptance(
        client: HeartbeatClient, draining: threading.Event, wake: threading.Event, tick_s: float
    ) -> bool:
        """Waits until the master accepts this instance; False when told to stop first.

        Until then the shard touches no run, process or host: not even crash recovery, since
        another live instance of this shard may own what looks abandoned (docs/protocol.md, "Shard instances").
        """
        if not client.accepted.is_set():
            log.info("waiting for the master to accept this shard instance before touching any run or host")
        while not client.accepted.is_set():
            if draining.is_set():
                return False
            wake.wait(tick_s)
            wake.clear()
        return True

    @staticmethod
    def _loop(
        scheduler: Scheduler,
        config: SchedulerConfig,
        draining: threading.Event,
        at_once: threading.Event,
        wake: threading.Event,
    ) -> None:
        """Ticks until stopped and nothing is left running; see the module's docstring for the rules."""
        drain_deadline: float | None = None
        stopping_since: float | None = None
        while True:
            now = time.monotonic()
            try:
                if at_once.is_set():
                    scheduler.stop_runs(at_once=True)
                    stopping_since = stopping_since or now
                elif draining.is_set():
                    if drain_deadline is None:
                        drain_deadline = now + settings.FLEETSHARD_DRAIN_S
                    if now >= drain_deadline and scheduler.runs:
                        scheduler.stop_runs()
                        stopping_since = stopping_since or now
            except Exception:
                log.exception("stopping the runs failed; retrying")
            try:
                # A connection broken by a database restart is dropped here and reopened by the next query.
                close_old_connections()
                scheduler.tick(start_new=not draining.is_set())
            except Exception:
                # Keep watching the runs already started rather than leave them unattended.
                log.exception("scheduler tick failed; retrying")
            if draining.is_set() and Command._may_exit(scheduler, at_once, drain_deadline, stopping_since):
                return
            wake.wait(config.tick_s)
            wake.clear()

    @staticmethod
    def _may_exit(
        scheduler: Scheduler, at_once: threading.Event, drain_deadline: float | None, stopping_since: float | None
    ) -> bool:
        now = time.monotonic()
        if not scheduler.runs:
            return at_once.is_set() or not scheduler.busy or now >= (drain_deadline or 0)
        # Runs whose processes are all gone but whose ends cannot be recorded (the database fails):
        # the next start closes them as abandoned, so waiting longer gains nothing.
        if stopping_since is not None and now - stopping_since >= RECORD_GRACE_S:
            try:
                alive = scheduler.processes_alive
            except Exception:
                alive = True
            if not alive:
                log.warning("exiting with %d run ends unrecorded: the next start closes them", len(scheduler.runs))
                return True
        return False

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
