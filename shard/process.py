"""One run of a shard: the heartbeat client in a thread and the scheduler in the caller's, until told to stop.

SIGTERM drains: no new work starts, running jobs get `drain_s` seconds to finish and are then
stopped as `infra` failures, and a last heartbeat carries their ends to the master. A second
SIGTERM, a SIGINT, or a master that refuses this shard stops at once (SIGKILL to every run).
Either way nothing is left running. Until the master accepts this shard's instance the scheduler
does not start: another live instance of the shard may own what looks abandoned
(docs/protocol.md, "Shard instances").
"""

import logging
import signal
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from common.loop import Backoff, run_until_stopped
from shard.models import OutboxEntry
from shard.run.scheduler import Scheduler
from shard.sync.client import HeartbeatClient, HeartbeatFailed
from shard.sync.discovery import discovery_unacked
from shard.sync.instance import current_instance
from shard.sync.leader import HeartbeatLeadership, accepted_instance, heartbeat_loop
from shard.uploads.logs import LogShipper
from shard.uploads.results import ResultsUploader

log = logging.getLogger("shard.run_shard")

FINAL_HEARTBEATS = 3
# How long a stopping shard still tries to send the ends of its runs' logs (the next start sends the rest).
LOG_FLUSH_S = 5.0

# Once every process of the runs is gone, how long the loop still tries to record their ends before
# it exits anyway (a database that fails every query must not keep a stopping shard alive).
RECORD_GRACE_S = 5.0

# A failing scheduler tick is retried within this long (or one tick, if longer).
TICK_RETRY_CAP_S = 2.0


class ShardProcess:
    def __init__(
        self, client: HeartbeatClient, scheduler: Scheduler, *, drain_s: float, exit_when_idle_s: float | None = None
    ) -> None:
        self.client = client
        self.scheduler = scheduler
        self.drain_s = drain_s
        # An elastic worker exits once it has had no run of its own (nor host command) this long.
        self.exit_when_idle_s = exit_when_idle_s
        self.exited_idle = False
        # No new work; the runs get drain_s to end.
        self.draining = threading.Event()
        # Every run is killed now.
        self.at_once = threading.Event()
        # Cuts the scheduler's wait between ticks short.
        self.wake = threading.Event()
        self.heartbeat_stop = threading.Event()
        self.leadership = HeartbeatLeadership(
            self.heartbeat_stop,
            settings.FLEETSHARD_HEARTBEAT_INTERVAL_S,
            what="the shard's heartbeat",
            presence=scheduler.runner_id,
            on_outbox=client.nudge.set,
        )
        # Why the shard stopped on its own (the master refused it); None when it was told to.
        self.fatal: str | None = None
        # Called once the scheduler is done, before the heartbeat stops, unless the master refused the
        # shard: an elastic worker releases its hosts here, so that a worker holding the shard's
        # heartbeat itself (no manager beside it) still tells the master in its last heartbeats.
        self.before_exit: Callable[[], None] | None = None
        self.scheduler_started = False
        # The instance id this process was accepted under, and when (monotonic) it last checked it.
        self._instance: str | None = None
        self._instance_checked = 0.0
        self._heartbeat: threading.Thread | None = None
        # Ended runs' result files go to the master in a thread of their own: a slow master must
        # delay neither heartbeats nor the scheduler. It stops with the heartbeat; what it has not
        # sent stays on disk for the next start.
        self.uploader = ResultsUploader(client, scheduler.config)
        self._uploads: threading.Thread | None = None
        # Runs' logs go to the master as they grow, in a thread of their own for the same reason.
        self.log_shipper = LogShipper(client, scheduler.config.results_root)
        self._log_shipping: threading.Thread | None = None

    # Stopping: safe from a signal handler or another thread.

    def drain(self) -> None:
        """A first SIGTERM: no new work, the runs get drain_s seconds; a second stops at once."""
        if self.draining.is_set():
            self.stop_at_once()
            return
        log.info("draining (no new work; %g s for running jobs)", self.drain_s)
        self.draining.set()
        self.wake.set()

    def stop_at_once(self) -> None:
        log.info("stopping at once")
        self.at_once.set()
        self.draining.set()
        self.wake.set()

    def on_signal(self, signum: int) -> None:
        log.info("%s received", signal.Signals(signum).name)
        if signum == signal.SIGINT:
            self.stop_at_once()
        else:
            self.drain()

    # The run.

    def run(self) -> None:
        """Heartbeats, then schedules once accepted, until stopped and nothing is left running."""
        self.start()
        try:
            if self._wait_for_acceptance():
                log.info("the master accepted this shard database's instance %s: scheduling", self._instance)
                self.scheduler_started = True
                self._loop()
            if self.before_exit is not None and not self.fatal:
                self.before_exit()
        finally:
            self.stop()

    def start(self) -> None:
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._heartbeat.start()
        self._uploads = threading.Thread(
            target=self.uploader.run, args=(self.heartbeat_stop,), name="results", daemon=True
        )
        self._uploads.start()
        self._log_shipping = threading.Thread(
            target=self.log_shipper.run, args=(self.heartbeat_stop,), name="logs", daemon=True
        )
        self._log_shipping.start()

    def stop(self) -> None:
        """Ends what is left (host commands, every process of this runner), then the heartbeat, then flushes."""
        self.scheduler.hosts.stop_all()
        # Nothing of ours may outlive us, and our empty cgroups go too.
        self.scheduler.executor.kill_runner(self.scheduler.runner_id)
        self.heartbeat_stop.set()
        self.client.nudge.set()
        for thread in (self._uploads, self._log_shipping):
            if thread is not None:
                thread.join(timeout=2 if self.at_once.is_set() else self.client.timeout[1] + 10)
        if self._heartbeat is None:
            return
        deadline = time.monotonic() + self.client.timeout[1] + 10
        while self._heartbeat.is_alive() and time.monotonic() < deadline:
            if self.at_once.is_set():  # also when a second SIGTERM or a SIGINT comes during this wait
                deadline = min(deadline, time.monotonic() + 2)
            self._heartbeat.join(timeout=0.1)
        if not self.at_once.is_set() and not self._heartbeat.is_alive():
            self._flush()
        if not self.at_once.is_set() and self._log_shipping is not None and not self._log_shipping.is_alive():
            self.log_shipper.flush(LOG_FLUSH_S)

    def _heartbeat_loop(self) -> None:
        heartbeat_loop(self.client, self.leadership, self._refused, on_ingest=self.wake.set)

    def _refused(self, why: str) -> None:
        self.fatal = why
        self.stop_at_once()

    def _wait_for_acceptance(self) -> bool:
        """Waits until the master accepts this instance, noting the instance id it accepted (which
        `_check_instance` then watches); False when told to stop first. A database error is retried."""
        if not self.client.accepted.is_set():
            log.info("waiting for the master to accept this shard instance before touching any run or host")
        since = time.monotonic()
        while not self.client.accepted.is_set():
            if self.draining.is_set() or self._idle_for_long(time.monotonic() - since):
                return False
            try:
                # Another process of this shard holds the heartbeat (elastic workers): its answers count.
                if self.leadership.follows.is_set():
                    instance = accepted_instance(self.client.interval)
                    if instance is not None:
                        self._instance = instance
                        # The results uploader waits for it too.
                        self.client.accepted.set()
                        return True
            except DatabaseError as exc:
                log.warning("cannot read the shard's instance or its last heartbeat: %s", exc)
            self.wake.wait(self.scheduler.config.tick_s)
            self.wake.clear()
        # This process's own heartbeat was answered: under the id it sent.
        self._instance = self.client.instance
        return True

    def _loop(self) -> None:
        """Ticks the scheduler until the shard may exit. A failing tick is retried after a short
        jittered back-off (common/loop.py), watching the runs already started rather than leaving
        them unattended."""
        self._drain_deadline: float | None = None
        self._stopping_since: float | None = None
        self._busy_at = time.monotonic()
        self._exiting = False
        tick_s = self.scheduler.config.tick_s
        run_until_stopped(
            self._step,
            threading.Event(),
            what="scheduler tick",
            log=log,
            backoff=Backoff(base_s=tick_s, cap_s=max(tick_s, TICK_RETRY_CAP_S)),
            wait=self._pause,
        )

    def _pause(self, delay: float) -> None:
        self.wake.wait(delay)
        self.wake.clear()

    def _step(self) -> float | None:
        now = time.monotonic()
        if self._exiting:
            return None
        if self.scheduler.busy:
            self._busy_at = now
        elif self._idle_for_long(now - self._busy_at):
            return None
        elif self.scheduler.done and not self.draining.is_set():
            log.info("%s", self.scheduler.done)
            self.exited_idle = True
            self.draining.set()
        try:
            if self.at_once.is_set():
                self.scheduler.stop_runs(at_once=True)
                self._stopping_since = self._stopping_since or now
            elif self.draining.is_set():
                if self._drain_deadline is None:
                    self._drain_deadline = now + self.drain_s
                if now >= self._drain_deadline and self.scheduler.runs:
                    self.scheduler.stop_runs()
                    self._stopping_since = self._stopping_since or now
        except Exception:
            log.exception("stopping the runs failed; retrying")
        try:
            # A connection broken by a database restart is dropped here and reopened by the next query.
            close_old_connections()
            self._check_instance(now)
            runs = set(self.scheduler.runs)
            self.scheduler.tick(start_new=not self.draining.is_set())
            if set(self.scheduler.runs) != runs:
                # A run started or ended: the master hears of it now, not at the next interval.
                self.client.nudge.set()
                if runs - set(self.scheduler.runs):
                    self.uploader.wake.set()
        finally:
            self._exiting = self.draining.is_set() and self._may_exit(self._drain_deadline, self._stopping_since)
        return None if self._exiting else self.scheduler.config.tick_s

    def _check_instance(self, now: float) -> None:
        """Once an interval: whether this shard database still has the instance id this process was
        accepted under. Another process of it took a new one, told by the master that the database
        went back in time (a backup restored under running processes): then no process of it may
        start or keep anything before the master accepts the new id (docs/protocol.md, "Shard
        instances"), and this one stops as the one that was told does."""
        if self._instance is None or self.at_once.is_set() or now - self._instance_checked < self.client.interval:
            return
        self._instance_checked = now
        current = current_instance()
        if current != self._instance:
            why = (
                f"this shard database took the new instance id {current} in place of {self._instance}, under "
                "which this process was accepted (the master said the database went back in time)"
            )
            log.error("%s", why)
            self._refused(why)

    def _idle_for_long(self, idle_s: float) -> bool:
        if self.exit_when_idle_s is None or self.draining.is_set() or idle_s < self.exit_when_idle_s:
            return False
        log.info("no run for %g s: exiting (--exit-when-idle)", idle_s)
        self.exited_idle = True
        self.draining.set()
        return True

    def _may_exit(self, drain_deadline: float | None, stopping_since: float | None) -> bool:
        now = time.monotonic()
        scheduler = self.scheduler
        if not scheduler.runs:
            return self.at_once.is_set() or not scheduler.busy or now >= (drain_deadline or 0)
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

    def _flush(self) -> None:
        """A last heartbeat or two so the master learns how the jobs ended; the outbox keeps the rest."""
        if not self.leadership.held_when_stopped:
            return  # the process holding the heartbeat now sends them
        for _ in range(FINAL_HEARTBEATS):
            try:
                if not OutboxEntry.objects.exists() and not discovery_unacked():
                    return
                self.client.tick()
            except (HeartbeatFailed, DatabaseError) as exc:
                log.warning("final heartbeat failed (%s); the next start sends the rest", exc)
                return
