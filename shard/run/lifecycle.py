"""A host's life between jobs: `Cleaning` then `Ready` after a good run, `Repairing` after a bad one.

Host status is the shard's to set and reaches the master through `known_hosts`. Every change here is
a conditional UPDATE on the host's runner (the scheduler process that holds it, shard.models.HostState)
through shard.services.move_host, so two scheduler processes on one database never both act on one host.
"""

import logging
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import F, Q

from common.constants import HostStatus
from common.models import Host
from shard.config import SchedulerConfig
from shard.locks import shard_write
from shard.run.executor import Executor, RunHandle, RunSpec
from shard.run.isolation import give_to
from shard.run.workspace import BadHost, attributes_of, command_env, host_command_dir
from shard.services import HostTaken, move_host

log = logging.getLogger(__name__)

CLEANUP = "cleanup"
REPAIR = "repair"


@dataclass
class HostTask:
    host_id: int
    hostname: str
    kind: str
    handle: RunHandle | None = None
    deadline: float = 0.0
    killed: bool = False
    cooldown_until: float | None = None


class HostLifecycle:
    def __init__(self, runner_id: str, executor: Executor, config: SchedulerConfig) -> None:
        self.runner_id = runner_id
        self.executor = executor
        self.config = config
        self.tasks: dict[int, HostTask] = {}

    def _set(self, host_id: int, status: str, *, release: bool = False, failed_repair: bool = False) -> bool:
        """Moves a host this process holds; False (nothing changed) when it holds it no more."""
        holder = "" if release else self.runner_id
        try:
            with shard_write():
                move_host(host_id, status, held_by=self.runner_id, holder=holder, failed_repair=failed_repair)
        except HostTaken:
            return False
        return True

    def _held(self, host_id: int) -> Host | None:
        return Host.objects.filter(id=host_id, state__runner=self.runner_id).first()

    def _start_command(self, host: Host, kind: str, command: str) -> HostTask:
        task = HostTask(host.id, host.hostname, kind, deadline=time.monotonic() + self.config.host_command_timeout_s)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        try:
            workdir = host_command_dir(self.config.results_root, host.hostname, kind, stamp)
            give_to(workdir, self.config.job_user)
            env = command_env(host, workdir, self.config.env_passthrough)
            spec = RunSpec(
                command,
                workdir,
                workdir / f"{kind}.log",
                env,
                user=self.config.job_user,
                runner=self.runner_id,
                name=f"host-{host.id}-{kind}",
                max_log_bytes=self.config.max_log_bytes,
            )
            task.handle = self.executor.start(spec)
        except Exception as exc:
            log.warning("host %s: cannot start its %s command: %s", host.hostname, kind, exc)
            task.killed = True
        return task

    def after_job(self, host_id: int, ok: bool) -> None:
        """A run on the host ended: clean it after a good run, repair it after a failed or killed one."""
        if ok:
            self.clean(host_id)
        else:
            self.repair(host_id)

    def clean(self, host_id: int) -> None:
        host = self._held(host_id)
        if host is None or not self._set(host_id, HostStatus.CLEANING):
            return
        try:
            command = attributes_of(host).get("cleanup_command") or self.config.cleanup_command
        except BadHost as exc:
            self._give_up(host, str(exc))
            return
        if command:
            self.tasks[host_id] = self._start_command(host, CLEANUP, command)
        else:
            self.tasks[host_id] = HostTask(host_id, host.hostname, CLEANUP, cooldown_until=self._cooldown_end())

    def repair(self, host_id: int) -> None:
        host = self._held(host_id)
        if host is None or not self._set(host_id, HostStatus.REPAIRING):
            return
        try:
            command = attributes_of(host).get("repair_command") or self.config.repair_command
        except BadHost as exc:
            self._give_up(host, str(exc))
            return
        if not command:
            self._set(host_id, HostStatus.READY, release=True)
            return
        log.info("host %s: repairing", host.hostname)
        self.tasks[host_id] = self._start_command(host, REPAIR, command)

    def _give_up(self, host: Host, reason: str) -> None:
        """A host whose config cannot be used gets no work until the master changes it."""
        log.warning("%s: Repair Failed until its config changes", reason)
        self.tasks.pop(host.id, None)
        self._set(host.id, HostStatus.REPAIR_FAILED, release=True, failed_repair=True)

    def _cooldown_end(self) -> float:
        return time.monotonic() + self.config.cooldown_s

    def poll(self) -> None:
        now = time.monotonic()
        for task in list(self.tasks.values()):
            try:
                self._poll_task(task, now)
            except Exception:
                # One host's trouble (its database row, its command) never stops the others.
                log.exception("host %s: watching its %s command failed; retrying next tick", task.hostname, task.kind)

    def _poll_task(self, task: HostTask, now: float) -> None:
        if task.handle is not None:
            code = task.handle.poll()
            if code is None:
                if now >= task.deadline and not task.killed:
                    log.warning("host %s: its %s command timed out", task.hostname, task.kind)
                    task.handle.signal_all(signal.SIGKILL)
                    task.killed = True
                return
            if task.handle.lingering():
                # The command ended; what it left behind goes with it before the host is used again.
                task.handle.signal_all(signal.SIGKILL)
                return
            task.handle.close()
            task.handle = None
            self._command_done(task, code == 0 and not task.killed, code)
        elif task.killed:
            self._command_done(task, False, None)
        elif task.cooldown_until is not None and now >= task.cooldown_until:
            del self.tasks[task.host_id]
            self._set(task.host_id, HostStatus.READY, release=True)

    def _command_done(self, task: HostTask, ok: bool, code: int | None) -> None:
        del self.tasks[task.host_id]
        if task.kind == CLEANUP:
            if ok:
                self.tasks[task.host_id] = HostTask(
                    task.host_id, task.hostname, CLEANUP, cooldown_until=self._cooldown_end()
                )
            else:
                log.warning("host %s: cleanup failed (exit %s): repairing", task.hostname, code)
                self.repair(task.host_id)
        elif ok:
            log.info("host %s: repaired", task.hostname)
            self._set(task.host_id, HostStatus.READY, release=True)
        else:
            log.warning("host %s: repair failed (exit %s): no work until its config changes", task.hostname, code)
            self._set(task.host_id, HostStatus.REPAIR_FAILED, release=True, failed_repair=True)

    def retry_failed_repairs(self) -> None:
        """A `Repair Failed` host whose config the master changed since (an unlock, say) is repaired again."""
        newer = Q(state__repair_failed_version__isnull=True) | Q(version__gt=F("state__repair_failed_version"))
        for host_id in Host.objects.filter(
            newer, status=HostStatus.REPAIR_FAILED, state__runner="", state__retired=False
        ).values_list("id", flat=True):
            try:
                with shard_write():
                    move_host(
                        host_id,
                        HostStatus.REPAIRING,
                        held_by="",
                        holder=self.runner_id,
                        retired=False,
                        status=HostStatus.REPAIR_FAILED,
                    )
            except HostTaken:
                continue
            self.repair(host_id)

    def stop_all(self) -> None:
        """Kills the hosts' commands; those hosts stay `Repairing`, unowned, for the next start to repair."""
        for task in self.tasks.values():
            if task.handle is not None:
                task.handle.signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(t.handle and t.handle.lingering() for t in self.tasks.values()):
            time.sleep(0.05)
        for host_id, task in self.tasks.items():
            if task.handle is not None:
                task.handle.close()
            cooling = task.kind == CLEANUP and task.handle is None and not task.killed
            try:
                self._set(host_id, HostStatus.READY if cooling else HostStatus.REPAIRING, release=True)
            except Exception as exc:
                # Left marked as ours: the next start finds its runner dead and repairs the host.
                log.warning("host %s: cannot release it (%s)", task.hostname, exc)
        self.tasks.clear()
