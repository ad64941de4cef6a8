"""The shard's scheduler: gives queued HQEs to hosts, watches their runs, and moves hosts between jobs.

One `tick()` does everything and returns at once; `run_shard` calls it in a loop. A host is claimed
by a conditional UPDATE (`status='Ready'` and no runner) in the same transaction as its HQE's
Queued -> Starting change, so however many scheduler processes share the shard's database, a host
gets one HQE and an HQE gets one host.
"""

import logging
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from common.constants import FailureClass, HostStatus, HQEStatus
from common.errors import FleetshardError
from common.models import Host, HostQueueEntry, Job
from shard.executor import Executor, LocalExecutor, RunHandle, RunSpec, base_env, env_name, read_tail
from shard.lifecycle import HostLifecycle, fresh_dir, host_env, safe_name
from shard.locks import shard_write
from shard.recovery import current_runner_id, recover_abandoned
from shard.services import finish_hqe, record_run, transition_hqe

log = logging.getLogger(__name__)

QUEUED_BATCH = 1000


@dataclass(frozen=True)
class SchedulerConfig:
    results_root: Path
    tick_s: float = 1.0
    max_runs: int = 100
    abort_grace_s: float = 30.0
    cleanup_command: str = ""
    repair_command: str = ""
    cooldown_s: float = 0.0
    host_command_timeout_s: float = 1800.0
    minute_s: float = 60.0
    recover_every_s: float = 10.0

    @classmethod
    def from_settings(cls) -> "SchedulerConfig":
        return cls(
            results_root=Path(settings.FLEETSHARD_RESULTS_DIR),
            tick_s=settings.FLEETSHARD_SCHEDULER_TICK_S,
            max_runs=settings.FLEETSHARD_MAX_RUNS,
            abort_grace_s=settings.FLEETSHARD_ABORT_GRACE_S,
            cleanup_command=settings.FLEETSHARD_CLEANUP_COMMAND,
            repair_command=settings.FLEETSHARD_REPAIR_COMMAND,
            cooldown_s=settings.FLEETSHARD_COOLDOWN_S,
            host_command_timeout_s=settings.FLEETSHARD_HOST_COMMAND_TIMEOUT_S,
            minute_s=settings.FLEETSHARD_MINUTE_S,
        )


# Why a run is being stopped; the HQE's end follows from it.
TIMEOUT = "timeout"
ABORT = "abort"
SHUTDOWN = "shutdown"


@dataclass
class Run:
    hqe_id: int
    job_id: int
    host_id: int
    handle: RunHandle
    log_path: Path
    deadline: float
    reason: str = ""
    term_at: float | None = None
    killed: bool = False


def job_env(job: Job, hqe_id: int, host: Host, results_dir: Path) -> dict[str, str]:
    env = base_env() | host_env(host)
    env.update(
        FLEETSHARD_JOB_ID=str(job.id),
        FLEETSHARD_HQE_ID=str(hqe_id),
        FLEETSHARD_RESULTS_DIR=str(results_dir),
    )
    for keyvals in (job.suite_keyvals or {}, job.keyvals or {}):
        for key, value in keyvals.items():
            env[f"FLEETSHARD_KEYVAL_{env_name(key)}"] = str(value)
    return env


class Scheduler:
    def __init__(self, config: SchedulerConfig, executor: Executor | None = None, runner_id: str | None = None) -> None:
        self.config = config
        self.executor = executor or LocalExecutor()
        self.runner_id = runner_id or current_runner_id()
        self.runs: dict[int, Run] = {}
        self.hosts = HostLifecycle(self.runner_id, self.executor, config)
        self._next_recovery = 0.0

    # The loop's single step.

    def tick(self, *, start_new: bool = True) -> None:
        """One pass: recover, expire, watch runs and hosts, then (unless draining) start new runs."""
        phases = [self._recover_if_due, self._expire, self._poll_runs, self.hosts.poll]
        if start_new:
            phases += [self.hosts.retry_failed_repairs, self._schedule]
        for phase in phases:
            try:
                phase()
            except DatabaseError as exc:
                # A lock timeout or deadlock victim: nothing was half-done; the next tick retries.
                log.warning("scheduler %s: database error, retrying next tick: %s", phase.__name__, exc)

    @property
    def busy(self) -> bool:
        return bool(self.runs or self.hosts.tasks)

    def recover(self) -> None:
        """Closes work abandoned by dead scheduler processes (this one's crashed predecessor included)."""
        for host_id in recover_abandoned(self.runner_id, self.executor):
            self.hosts.repair(host_id)
        # A host of ours that nothing here tends (a database error cut its change short) is repaired too.
        tended = {r.host_id for r in self.runs.values()} | set(self.hosts.tasks)
        busy = (HostStatus.RUNNING, HostStatus.CLEANING, HostStatus.REPAIRING)
        for host_id in Host.objects.filter(runner=self.runner_id, status__in=busy).values_list("id", flat=True):
            if host_id not in tended:
                self.hosts.repair(host_id)
        self._next_recovery = time.monotonic() + self.config.recover_every_s

    def _recover_if_due(self) -> None:
        if time.monotonic() >= self._next_recovery:
            self.recover()

    # Queued HQEs.

    def _expire(self) -> None:
        now = timezone.now()
        queued = HostQueueEntry.objects.filter(status=HQEStatus.QUEUED).values_list(
            "id", "job__created_on", "job__timeout_mins"
        )
        for hqe_id, created_on, timeout_mins in queued:
            if created_on + timedelta(seconds=timeout_mins * self.config.minute_s) <= now:
                try:
                    with shard_write():
                        finish_hqe(hqe_id, HQEStatus.EXPIRED)
                except FleetshardError:
                    continue
                log.info("HQE %s expired: still queued %s min after its job was created", hqe_id, timeout_mins)

    def _schedule(self) -> None:
        if len(self.runs) >= self.config.max_runs:
            return
        ready = {
            h.id: h
            for h in Host.objects.filter(status=HostStatus.READY, locked=False, retired=False, runner="").order_by("id")
        }
        if not ready:
            return
        labels: dict[int, set[int]] = {h: set() for h in ready}
        for host_id, label_id in Host.labels.through.objects.filter(host_id__in=ready).values_list(
            "host_id", "label_id"
        ):
            labels[host_id].add(label_id)
        queued = list(
            HostQueueEntry.objects.filter(status=HQEStatus.QUEUED, job__aborted=False)
            .select_related("job")
            .order_by("-job__priority", "job__created_on", "job_id", "id")[:QUEUED_BATCH]
        )
        deps: dict[int, set[int]] = {}
        for job_id, label_id in Job.dependency_labels.through.objects.filter(
            job_id__in={q.job_id for q in queued}
        ).values_list("job_id", "label_id"):
            deps.setdefault(job_id, set()).add(label_id)
        for hqe in queued:
            if not ready or len(self.runs) >= self.config.max_runs:
                return
            if hqe.meta_host_id is None:
                candidates = [hqe.host_id] if hqe.host_id in ready else []
            else:
                needed = deps.get(hqe.job_id, set()) | {hqe.meta_host_id}
                candidates = [h for h in ready if needed <= labels[h]]
            for host_id in candidates:
                outcome = self._claim(hqe.id, host_id)
                if outcome == "host-taken":
                    del ready[host_id]
                    continue
                if outcome == "claimed":
                    self._start(hqe, ready.pop(host_id))
                break

    def _claim(self, hqe_id: int, host_id: int) -> str:
        """Takes the host and the HQE together, or neither: 'claimed', 'host-taken' or 'hqe-taken'."""
        try:
            with shard_write():
                taken = Host.objects.filter(
                    id=host_id, status=HostStatus.READY, locked=False, retired=False, runner=""
                ).update(status=HostStatus.RUNNING, runner=self.runner_id)
                if taken != 1:
                    return "host-taken"
                if Job.objects.filter(hqes__id=hqe_id, aborted=True).exists():
                    raise FleetshardError(f"job of HQE {hqe_id} was aborted")
                transition_hqe(hqe_id, HQEStatus.STARTING, host_id=host_id)
                record_run(hqe_id, runner=self.runner_id)
        except FleetshardError:
            return "hqe-taken"
        return "claimed"

    # Runs.

    def _start(self, hqe: HostQueueEntry, host: Host) -> None:
        job = hqe.job
        try:
            results_dir = fresh_dir(self.config.results_root / str(job.id), f"{hqe.id}-{safe_name(host.hostname)}")
            log_path = results_dir / "job.log"
            spec = RunSpec(job.command, results_dir, log_path, job_env(job, hqe.id, host, results_dir))
            handle = self.executor.start(spec)
        except OSError as exc:
            log.warning("HQE %s on %s: cannot start: %s", hqe.id, host.hostname, exc)
            with shard_write():
                finish_hqe(hqe.id, HQEStatus.FAILED, failure=FailureClass.INFRA, log_tail=f"cannot start: {exc}")
            self.hosts.after_job(host.id, ok=False)
            return
        deadline = time.monotonic() + job.max_runtime_mins * self.config.minute_s
        # Tracked before anything else can fail, so the process is always watched and ended.
        self.runs[hqe.id] = Run(hqe.id, job.id, host.id, handle, log_path, deadline)
        with shard_write():
            record_run(hqe.id, pid=handle.pid, results_dir=str(results_dir))
            transition_hqe(hqe.id, HQEStatus.RUNNING)
        log.info("HQE %s of job %s running on %s (pid %s)", hqe.id, job.id, host.hostname, handle.pid)

    def stop_runs(self, reason: str = SHUTDOWN, *, at_once: bool = False) -> None:
        """Starts stopping every run (SIGTERM, SIGKILL after the grace); at once means SIGKILL now."""
        for run in self.runs.values():
            if not run.reason:
                run.reason = reason
                self._note(run, "the shard is stopping: stopping the run")
            if at_once and not run.killed:
                run.handle.signal_all(signal.SIGKILL)
                run.killed = True

    def _note(self, run: Run, text: str) -> None:
        log.info("HQE %s: %s", run.hqe_id, text)
        try:
            with open(run.log_path, "a") as f:
                f.write(f"\n[fleetshard] {text}\n")
        except OSError:
            pass

    def _poll_runs(self) -> None:
        if not self.runs:
            return
        aborted = set(
            Job.objects.filter(id__in={r.job_id for r in self.runs.values()}, aborted=True).values_list("id", flat=True)
        )
        now = time.monotonic()
        for run in list(self.runs.values()):
            code = run.handle.poll()
            if not run.reason and code is None:
                if run.job_id in aborted:
                    run.reason = ABORT
                    self._note(run, "the job was aborted: stopping the run")
                elif now >= run.deadline:
                    run.reason = TIMEOUT
                    self._note(run, "max_runtime_mins reached: stopping the run")
            if run.reason and not run.killed:
                if run.term_at is None:
                    run.handle.signal_all(signal.SIGTERM)
                    run.term_at = now
                elif now - run.term_at >= self.config.abort_grace_s and run.handle.lingering():
                    self._note(run, f"still running {self.config.abort_grace_s:g} s after SIGTERM: SIGKILL")
                    run.handle.signal_all(signal.SIGKILL)
                    run.killed = True
            if code is None:
                continue
            if run.handle.lingering():
                if not run.reason:
                    # The main process ended; what it left in its process group goes with it.
                    run.handle.signal_all(signal.SIGKILL)
                continue
            self._finish(run, code)

    def _finish(self, run: Run, code: int) -> None:
        failure = ""
        if run.reason == ABORT:
            status = HQEStatus.ABORTED
        elif run.reason == TIMEOUT:
            status, failure = HQEStatus.FAILED, FailureClass.TIMEOUT
        elif run.reason == SHUTDOWN:
            status, failure = HQEStatus.FAILED, FailureClass.INFRA
        elif code == 0:
            status = HQEStatus.COMPLETED
        else:
            status, failure = HQEStatus.FAILED, FailureClass.TEST
        try:
            with shard_write():
                finish_hqe(run.hqe_id, status, failure=failure, exit_code=code, log_tail=read_tail(run.log_path))
        except FleetshardError as exc:
            log.warning("HQE %s: cannot record its end (%s): %s", run.hqe_id, status, exc)
        del self.runs[run.hqe_id]
        log.info(
            "HQE %s of job %s: %s%s (exit %s)", run.hqe_id, run.job_id, status, f"/{failure}" * bool(failure), code
        )
        self.hosts.after_job(run.host_id, ok=status == HQEStatus.COMPLETED)
