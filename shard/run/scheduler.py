"""The shard's scheduler: gives queued HQEs to hosts, watches their runs, and moves hosts between jobs.

One `tick()` does everything and returns at once; `run_shard` calls it in a loop. A host is claimed
by conditional UPDATEs (no runner in its shard.models.HostState, `status='Ready'` on the host) in the
same transaction as its HQE's Queued -> Starting change and the HQE's Run, so however many scheduler
processes share the shard's database, a host gets one HQE and an HQE gets one host.
"""

import logging
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path

from django.db import Error as DatabaseFailure
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone

from common.constants import FailureClass, HostStatus, HQEStatus
from common.errors import FleetshardError
from common.logjson import log_context
from common.models import Host, HostQueueEntry, Job
from common.wire import clean_text
from shard.blobs.cache import BlobCache, CacheError, Pin
from shard.blobs.inputs import provide_inputs, variant_inputs
from shard.blobs.outputs import make_outputs_dir
from shard.config import SchedulerConfig
from shard.locks import shard_write
from shard.models import Run
from shard.run.abrun import driver_command, driver_env
from shard.run.executor import Executor, LocalExecutor, RunHandle, RunSpec, append_note, read_tail
from shard.run.isolation import give_to, out_of_reach
from shard.run.lifecycle import HostLifecycle
from shard.run.recovery import close_abandoned_hqe, current_runner_id, isolated, recover_abandoned
from shard.run.workers import own_hosts, work_dir_size
from shard.run.workspace import RUN_LOG, job_env, make_results_folder, remove_old_results, run_dir
from shard.services import HostTaken, finish_hqe, move_host, open_run, record_run, transition_hqe

log = logging.getLogger(__name__)

QUEUED_BATCH = 1000
WORK_DIR_CHECK_S = 10.0


class StopReason(StrEnum):
    """Why a run is being stopped; the HQE's end follows from it."""

    TIMEOUT = "timeout"
    ABORT = "abort"
    SHUTDOWN = "shutdown"
    VANISHED = "vanished"


class Claim(StrEnum):
    """What came of trying to give a host to an HQE."""

    CLAIMED = "claimed"
    HOST_TAKEN = "host-taken"
    HOST_USED = "host-used"
    HQE_TAKEN = "hqe-taken"


@dataclass
class LiveRun:
    """A run this process started and watches; its database record is a shard.models.Run."""

    hqe_id: int
    job_id: int
    host_id: int
    handle: RunHandle
    log_path: Path
    deadline: float
    reason: StopReason | None = None
    term_at: float | None = None
    killed: bool = False
    # Holds on the cached inputs it reads: released when it ends, so eviction may take them.
    pins: list[Pin] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        executor: Executor | None = None,
        runner_id: str | None = None,
        cache: BlobCache | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.executor = executor or LocalExecutor()
        self.runner_id = runner_id or current_runner_id()
        self.runs: dict[int, LiveRun] = {}
        # Which hosts this process may run on: an elastic worker's own, or no worker's (shard/run/workers.py).
        self.own_hosts = own_hosts(None)
        # How many runs this process has started (an elastic worker's --exit-after-num-runs).
        self.started = 0
        self.max_starts: int | None = None
        # An elastic worker's --max-work-dir-size: no new run while its runs' directories hold more.
        self.max_work_dir_bytes: int | None = None
        self._work_dir_full = False
        # When the size was last measured, and of which runs: walking every run directory at every
        # tick cost a worker with many runs' files more than its tick.
        self._work_dir_checked: tuple[float, int, frozenset[int]] | None = None
        self.hosts = HostLifecycle(self.runner_id, self.executor, config)
        self._next_recovery = 0.0
        self._next_retention = 0.0

    # The loop's single step.

    def tick(self, *, start_new: bool = True) -> None:
        """One pass: recover, expire, watch runs and hosts, then (unless draining) start new runs."""
        phases = [self._recover_if_due, self._expire, self._poll_runs, self.hosts.poll]
        if start_new and self.max_work_dir_bytes is not None:
            start_new = not self.work_dir_full()
        if start_new:
            phases += [self.hosts.retry_failed_repairs, self._schedule, self._remove_old_results]
        for phase in phases:
            try:
                phase()
            except DatabaseFailure as exc:
                # A lock timeout, a deadlock victim or a lost connection: nothing was half-done. A
                # broken connection is dropped so the next phase reconnects; the next tick retries.
                log.warning("scheduler %s: database error, retrying next tick: %s", phase.__name__, exc)
                close_old_connections()
            except Exception:
                # A bug or a bad record must cost one phase of one tick, never the loop: the runs
                # already started are still watched by the phases after this one.
                log.exception("scheduler %s failed; retrying next tick", phase.__name__)

    def work_dir_full(self) -> bool:
        """Whether this worker's run directories hold more than --max-work-dir-size: measured again
        once a run started or ended, else at most every WORK_DIR_CHECK_S."""
        assert self.max_work_dir_bytes is not None
        now = time.monotonic()
        checked = self._work_dir_checked
        runs = frozenset(self.runs)
        if checked is not None and checked[1:] == (self.started, runs) and now - checked[0] < WORK_DIR_CHECK_S:
            return self._work_dir_full
        self._work_dir_checked = (now, self.started, runs)
        size = work_dir_size(self.runner_id)
        full = size > self.max_work_dir_bytes
        if full and not self._work_dir_full:
            log.info("work directory holds %d bytes, more than --max-work-dir-size: no new run", size)
        self._work_dir_full = full
        return full

    @property
    def starts_used_up(self) -> bool:
        return self.max_starts is not None and self.started >= self.max_starts

    @property
    def done(self) -> str | None:
        """Why an elastic worker is done once its runs have ended (its option), or None: it started its
        --exit-after-num-runs, or its work directory is over --max-work-dir-size (a fresh worker would
        start empty; this one, idle, only delayed the manager's next start by --idle-seconds)."""
        if self.starts_used_up:
            return f"{self.started} runs started and ended: exiting (--exit-after-num-runs)"
        if self._work_dir_full:
            return "work directory over --max-work-dir-size and its runs ended: exiting"
        return None

    @property
    def busy(self) -> bool:
        return bool(self.runs or self.hosts.tasks)

    @property
    def processes_alive(self) -> bool:
        """Whether any process of a run or host command is left (whatever the database knows)."""
        handles = [r.handle for r in self.runs.values()] + [t.handle for t in self.hosts.tasks.values() if t.handle]
        return any(h.lingering() for h in handles)

    def recover(self) -> None:
        """Closes work abandoned by dead scheduler processes (this one's crashed predecessor included).

        Each HQE and host is recovered on its own: one that cannot be is logged and retried at the
        next recovery, and never keeps the others (or the scheduling after) from happening.
        """
        self._next_recovery = time.monotonic() + self.config.recover_every_s
        for host_id in recover_abandoned(self.runner_id, self.executor):
            isolated(f"host {host_id}: repair", self.hosts.repair, host_id)
        # An HQE of ours that no run here tracks (its start failed half-way) can never end otherwise.
        untracked = (
            HostQueueEntry.objects.filter(
                run__runner=self.runner_id, status__in=(HQEStatus.STARTING, HQEStatus.RUNNING)
            )
            .exclude(id__in=list(self.runs))
            .select_related("run")
        )
        for hqe in untracked:
            isolated(f"HQE {hqe.id}: closing", close_abandoned_hqe, hqe, "its run was lost by this shard process")
        # A host of ours that nothing here tends (a database error cut its change short) is repaired too.
        tended = {r.host_id for r in self.runs.values()} | set(self.hosts.tasks)
        busy = (HostStatus.RUNNING, HostStatus.CLEANING, HostStatus.REPAIRING)
        for host_id in Host.objects.filter(state__runner=self.runner_id, status__in=busy).values_list("id", flat=True):
            if host_id not in tended:
                isolated(f"host {host_id}: repair", self.hosts.repair, host_id)

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
            for h in Host.objects.filter(
                self.own_hosts, status=HostStatus.READY, locked=False, state__retired=False, state__runner=""
            ).order_by("id")
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
        job_ids = {q.job_id for q in queued}
        deps: dict[int, set[int]] = {}
        for job_id, label_id in Job.dependency_labels.through.objects.filter(job_id__in=job_ids).values_list(
            "job_id", "label_id"
        ):
            deps.setdefault(job_id, set()).add(label_id)
        used = self._hosts_of(job_ids)
        for hqe in queued:
            if not ready or len(self.runs) >= self.config.max_runs or self.starts_used_up:
                return
            if hqe.meta_host_id is None:
                candidates = [hqe.host_id] if hqe.host_id in ready else []
            else:
                needed = deps.get(hqe.job_id, set()) | {hqe.meta_host_id}
                taken = used.get(hqe.job_id, set())
                candidates = [h for h in ready if needed <= labels[h] and h not in taken]
            for host_id in candidates:
                outcome = self._claim(hqe.id, hqe.job_id, host_id)
                if outcome == Claim.HOST_TAKEN:
                    del ready[host_id]
                    continue
                if outcome == Claim.HOST_USED:
                    continue
                if outcome == Claim.CLAIMED:
                    used.setdefault(hqe.job_id, set()).add(host_id)
                    self._start(hqe, ready.pop(host_id))
                break

    @staticmethod
    def _hosts_of(job_ids: set[int]) -> dict[int, set[int]]:
        """The hosts each job's HQEs run, ran or are named for: a job never uses a host twice."""
        used: dict[int, set[int]] = {}
        for job_id, host_id in HostQueueEntry.objects.filter(job_id__in=job_ids, host_id__isnull=False).values_list(
            "job_id", "host_id"
        ):
            used.setdefault(job_id, set()).add(host_id)
        return used

    def _claim(self, hqe_id: int, job_id: int, host_id: int) -> Claim:
        """Takes the host and the HQE together, or neither."""
        try:
            with shard_write():
                move_host(
                    host_id,
                    HostStatus.RUNNING,
                    held_by="",
                    holder=self.runner_id,
                    retired=False,
                    status=HostStatus.READY,
                    locked=False,
                )
                if Job.objects.filter(id=job_id, aborted=True).exists():
                    raise FleetshardError(f"job of HQE {hqe_id} was aborted")
                # Checked again under the host's row lock: another scheduler process may have given
                # this host to another HQE of the job since this pass read the job's hosts.
                if HostQueueEntry.objects.filter(job_id=job_id, host_id=host_id).exclude(id=hqe_id).exists():
                    raise HostUsed(f"job {job_id} already used host {host_id}")
                transition_hqe(hqe_id, HQEStatus.STARTING, host_id=host_id)
                open_run(hqe_id, self.runner_id)
        except HostTaken:
            return Claim.HOST_TAKEN
        except HostUsed:
            return Claim.HOST_USED
        except FleetshardError:
            return Claim.HQE_TAKEN
        return Claim.CLAIMED

    # Runs.

    def _start(self, hqe: HostQueueEntry, host: Host) -> None:
        """Starts a claimed HQE's run; whatever goes wrong ends that HQE alone as an infra failure."""
        job = hqe.job
        pins: list[Pin] = []
        try:
            results_dir = run_dir(self.config.results_root, job.id, hqe.id, host.hostname)
            give_to(results_dir, self.config.job_user)
            make_results_folder(results_dir, self.config.job_user)
            log_path = results_dir / RUN_LOG
            env = job_env(job, hqe.id, host, results_dir, self.config.env_passthrough)
            outputs = make_outputs_dir(results_dir)
            give_to(outputs, self.config.job_user)
            env["FLEETSHARD_OUTPUT_DIR"] = str(outputs)
            if job.inputs:
                env["FLEETSHARD_INPUT_DIR"] = str(
                    provide_inputs(self.cache, job.inputs, results_dir, pins, self.config.job_user)
                )
            command = job.command
            if job.ab:
                command = driver_command()
                inputs_dir = env.get("FLEETSHARD_INPUT_DIR")
                variant_dirs = variant_inputs(Path(inputs_dir), job.ab["variants"]) if inputs_dir else {}
                env.update(driver_env(job.ab, job.command, variant_dirs))
            spec = RunSpec(
                command,
                results_dir,
                log_path,
                env,
                user=self.config.job_user,
                runner=self.runner_id,
                name=f"hqe-{hqe.id}",
                max_log_bytes=self.config.max_log_bytes,
                driver=bool(job.ab),
            )
            handle = self.executor.start(spec)
        except Exception as exc:
            for pin in pins:
                pin.release()
            self._cannot_start(hqe, host, exc, host_ok=isinstance(exc, CacheError))
            return
        deadline = time.monotonic() + job.max_runtime_mins * self.config.minute_s
        # Tracked before anything else can fail, so the process is always watched and ended.
        self.runs[hqe.id] = LiveRun(hqe.id, job.id, host.id, handle, log_path, deadline, pins=pins)
        self.started += 1
        try:
            with shard_write():
                record_run(hqe.id, pid=handle.pid, results_dir=str(results_dir))
                transition_hqe(hqe.id, HQEStatus.RUNNING)
        except Exception as exc:
            # The run goes on and is watched; its end is recorded from Starting just as well.
            log.warning("HQE %s: cannot record that it runs: %s", hqe.id, exc)
        log.info(
            "HQE %s of job %s running on %s (pid %s)",
            hqe.id,
            job.id,
            host.hostname,
            handle.pid,
            extra=log_context(hqe=hqe.id, job=job.id, host=host.hostname),
        )

    def _cannot_start(self, hqe: HostQueueEntry, host: Host, exc: Exception, *, host_ok: bool = False) -> None:
        """Ends the HQE Failed/infra with the reason; the host is repaired unless it is not to blame
        (an input that cannot be had says nothing of the host)."""
        log.warning(
            "HQE %s on %s: cannot start: %s",
            hqe.id,
            host.hostname,
            exc,
            extra=log_context(hqe=hqe.id, job=hqe.job_id, host=host.hostname),
        )
        reason = clean_text(f"[fleetshard] cannot start the job on {host.hostname}: {exc}")
        try:
            with shard_write():
                finish_hqe(hqe.id, HQEStatus.FAILED, failure=FailureClass.INFRA, log_tail=reason)
            self.hosts.after_job(host.id, ok=host_ok)
        except Exception:
            # Left Starting and ours: the next recovery closes it and repairs the host.
            log.exception("HQE %s: cannot record that it failed to start", hqe.id)

    def stop_runs(self, reason: StopReason = StopReason.SHUTDOWN, *, at_once: bool = False) -> None:
        """Starts stopping every run (SIGTERM, SIGKILL after the grace); at once means SIGKILL now."""
        for run in self.runs.values():
            if not run.reason:
                run.reason = reason
                self._note(run, "the shard is stopping: stopping the run")
            if at_once and not run.killed:
                run.handle.signal_all(signal.SIGKILL)
                run.killed = True

    def _note(self, run: LiveRun, text: str) -> None:
        log.info("HQE %s: %s", run.hqe_id, text, extra=log_context(hqe=run.hqe_id, job=run.job_id))
        try:
            if not run.handle.note(text):
                append_note(run.log_path, text)
        except OSError:
            pass

    def _poll_runs(self) -> None:
        if not self.runs:
            return
        try:
            # Runs to stop: their job aborted, or their host gone from the discovered set (shard/sync/discovery.py).
            stopping = HostQueueEntry.objects.filter(id__in=list(self.runs)).filter(
                Q(job__aborted=True) | Q(host__status=HostStatus.MISSING)
            )
            aborted: set[int] = set()
            vanished: set[int] = set()
            for hqe_id, job_aborted in stopping.values_list("id", "job__aborted"):
                if job_aborted:
                    aborted.add(self.runs[hqe_id].job_id)
                else:
                    vanished.add(hqe_id)
        except DatabaseFailure as exc:
            # Timeouts, a shutdown's signals and the runs' ends must not wait for the database.
            log.warning("cannot read which jobs were aborted (%s): watching the runs regardless", exc)
            aborted, vanished = set(), set()
        now = time.monotonic()
        for run in list(self.runs.values()):
            try:
                self._poll_run(run, run.job_id in aborted, now, vanished=run.hqe_id in vanished)
            except Exception:
                # Its end is recorded at a later tick; the other runs are watched meanwhile.
                log.exception("HQE %s: watching its run failed; retrying next tick", run.hqe_id)

    def _poll_run(self, run: LiveRun, aborted: bool, now: float, *, vanished: bool = False) -> None:
        code = run.handle.poll()
        if not run.reason and code is None:
            if vanished:
                run.reason = StopReason.VANISHED
                self._note(run, "the host left the discovered set: stopping the run (infra failure)")
            elif aborted:
                run.reason = StopReason.ABORT
                self._note(run, "the job was aborted: stopping the run")
            elif now >= run.deadline:
                run.reason = StopReason.TIMEOUT
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
            return
        if run.handle.lingering():
            if not run.reason:
                # The main process ended; what it left behind (daemons included) goes with it.
                run.handle.signal_all(signal.SIGKILL)
            return
        self._finish(run, code)

    def _finish(self, run: LiveRun, code: int) -> None:
        failure = ""
        if run.reason == StopReason.ABORT:
            status = HQEStatus.ABORTED
        elif run.reason == StopReason.TIMEOUT:
            status, failure = HQEStatus.FAILED, FailureClass.TIMEOUT
        elif run.reason in (StopReason.SHUTDOWN, StopReason.VANISHED):
            status, failure = HQEStatus.FAILED, FailureClass.INFRA
        elif code == 0:
            status = HQEStatus.COMPLETED
        else:
            status, failure = HQEStatus.FAILED, FailureClass.TEST
        host_ok = status == HQEStatus.COMPLETED
        if failure == FailureClass.TEST and (lost := self._lost_reach(run)):
            self._note(run, f"the job could not reach its own files when it ended: {lost}: an infra failure")
            failure, host_ok = FailureClass.INFRA, True
        tail = run.handle.log_tail()
        if tail is None:
            tail = read_tail(run.log_path)
        try:
            with shard_write():
                finish_hqe(run.hqe_id, status, failure=failure, exit_code=code, log_tail=tail)
        except FleetshardError as exc:
            log.warning("HQE %s: cannot record its end (%s): %s", run.hqe_id, status, exc)
        # A database error leaves the run here: the next tick records its end again.
        del self.runs[run.hqe_id]
        run.handle.close()
        for pin in run.pins:
            pin.release()
        log.info(
            "HQE %s of job %s: %s%s (exit %s)",
            run.hqe_id,
            run.job_id,
            status,
            f"/{failure}" * bool(failure),
            code,
            extra=log_context(hqe=run.hqe_id, job=run.job_id),
        )
        self.hosts.after_job(run.host_id, ok=host_ok)

    def _lost_reach(self, run: LiveRun) -> str | None:
        """Why the job user can no longer reach the run's directory or its inputs, if it cannot: a
        directory above tightened during the run (give_to and let_reach check only before it)."""
        paths = [run.log_path.parent] + ([self.cache.root / "blobs"] if run.pins and self.cache else [])
        return next(filter(None, (out_of_reach(path, self.config.job_user) for path in paths)), None)

    # Old results.

    def _remove_old_results(self) -> None:
        """Once an interval, removes run directories older than the retention (never an active run's)."""
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + self.config.retention_every_s
        now_s = time.time()
        cutoff = now_s - self.config.retention_days * 86400
        active = set(
            Run.objects.filter(hqe__status__in=(HQEStatus.STARTING, HQEStatus.RUNNING))
            .exclude(results_dir="")
            .values_list("results_dir", flat=True)
        )
        active |= {str(r.log_path.parent) for r in self.runs.values()}
        pending_cutoff = now_s - self.config.upload_horizon_days * 86400
        removed = remove_old_results(self.config.results_root, cutoff, active, pending_cutoff)
        if removed:
            log.info("removed %d run directories older than %g days", removed, self.config.retention_days)


class HostUsed(FleetshardError):
    """The job already used this host: a job never uses a host twice (its HQEs are meant to run on distinct hosts)."""
