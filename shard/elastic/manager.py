"""The worker manager's loop: each tick counts the queued work its workers could run and the workers its
backend reports, applies the policy (shard.elastic.policy) and says why it started nothing.

The time of the last start is the only thing it keeps, in the shard's database (shard.models.WorkerPool),
written before the backend is asked, so neither a restart nor a start that failed half-way lets two
starts come closer than the minimum interval.
"""

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.constants import HostStatus, HQEStatus
from common.models import Host, HostQueueEntry, Job
from shard.elastic.backends import Backend, BackendError
from shard.elastic.policy import Decision, Limits, Skip, Worker, WorkerState, decide
from shard.models import WorkerPool
from shard.run.recovery import runner_alive

log = logging.getLogger("shard.worker_manager")

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def pool_key(shard_hostname: str, labels: Sequence[str]) -> str:
    """The pool's name: its shard and a digest of its labels (a Slurm job name, a directory name)."""
    digest = hashlib.sha256("\0".join(sorted(set(labels))).encode()).hexdigest()[:10]
    return f"fleetshard-{SAFE_NAME.sub('_', shard_hostname)[:150]}-{digest}"


def queued_for(labels: Sequence[str]) -> "QuerySet[HostQueueEntry]":
    """The queued HQEs whose labels include every one of `labels`: the meta-host label and the job's
    dependency labels, or for an HQE naming its host, that host's labels."""
    hqes = HostQueueEntry.objects.filter(status=HQEStatus.QUEUED, job__aborted=False)
    for name in sorted(set(labels)):
        dependency = Job.dependency_labels.through.objects.filter(job_id=OuterRef("job_id"), label__name=name)
        of_host = Host.labels.through.objects.filter(host_id=OuterRef("host_id"), label__name=name)
        hqes = hqes.filter(
            Q(meta_host__name=name) | Q(Exists(dependency)) | (Q(meta_host__isnull=True) & Q(Exists(of_host)))
        )
    return hqes


def abandoned_work() -> bool:
    """Whether a dead scheduler process (a worker killed mid-run) left runs or hosts behind. Only a
    worker's recovery closes them (shard.run.recovery), so with no worker left they would stay open."""
    busy = (HostStatus.RUNNING, HostStatus.CLEANING, HostStatus.REPAIRING)
    active = (HQEStatus.STARTING, HQEStatus.RUNNING)
    runners = set(Host.objects.filter(status__in=busy).values_list("state__runner", flat=True))
    runners |= set(HostQueueEntry.objects.filter(status__in=active).values_list("run__runner", flat=True))
    return any(runner and not runner_alive(runner) for runner in runners)


def last_start(key: str) -> datetime | None:
    return WorkerPool.objects.filter(key=key).values_list("last_start", flat=True).first()


@transaction.atomic
def record_start(key: str, when: datetime) -> None:
    WorkerPool.objects.update_or_create(key=key, defaults={"last_start": when})


class Metrics:
    """The manager's Prometheus metrics, in a registry of its own (served by --metrics-port)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.workers = Gauge(
            "fleetshard_elastic_workers", "Workers the backend reports, by state", ["state"], registry=self.registry
        )
        self.queued = Gauge(
            "fleetshard_elastic_queued_hqes", "Queued HQEs the pool's workers could run", registry=self.registry
        )
        self.skipped = Counter(
            "fleetshard_elastic_start_skipped",
            "Ticks with work (or below the minimum) that started no worker, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.started = Counter("fleetshard_elastic_workers_started", "Workers started", registry=self.registry)
        self.stopped = Counter(
            "fleetshard_elastic_pending_workers_stopped",
            "Pending workers stopped because the queued work went away",
            registry=self.registry,
        )
        self.errors = Counter(
            "fleetshard_elastic_backend_errors", "Backend calls that failed, by call", ["call"], registry=self.registry
        )
        for state in WorkerState:
            self.workers.labels(state.value)
        for skip in Skip:
            self.skipped.labels(skip.value)
        for call in ("list", "start", "stop"):
            self.errors.labels(call)


class WorkerManager:
    def __init__(
        self,
        backend: Backend,
        limits: Limits,
        key: str,
        queued: Callable[[], int],
        *,
        clock: Callable[[], datetime] = timezone.now,
        metrics: Metrics | None = None,
        abandoned: Callable[[], bool] = abandoned_work,
        slots: int = 1,
        free: Callable[[set[str]], int] | None = None,
    ) -> None:
        self.backend = backend
        self.limits = limits
        self.key = key
        self.queued = queued
        self.abandoned = abandoned
        # Each worker brings `slots` hosts; `free` says how many of the queued HQEs the live workers'
        # hosts (and those of workers still registering) can take now, given the backend's active ids.
        self.slots = slots
        self.free = free
        self.clock = clock
        self.metrics = metrics or Metrics()
        self._last_skip: Skip | None = None
        self._found = False

    def tick(self) -> Decision | None:
        """One pass; None when the backend could not say which workers there are (nothing is done)."""
        queued = self.queued()
        try:
            workers = self.backend.list_workers()
        except BackendError as exc:
            self.metrics.errors.labels("list").inc()
            log.warning("cannot list the %s workers: %s", self.backend.name, exc)
            return None
        if self.free is not None and queued > 0:
            queued = max(0, queued - self.free({w.id for w in workers if w.state == WorkerState.ACTIVE}))
        if not self._found:
            self._found = True
            pending = sum(w.state == WorkerState.PENDING for w in workers)
            log.info("found %d %s workers of the pool (%d pending)", len(workers), self.backend.name, pending)
        now = self.clock()
        last = last_start(self.key)
        since = (now - last).total_seconds() if last else None
        limits = self.limits
        if limits.min_workers == 0 < limits.max_workers and self.abandoned():
            # At least one worker whatever the queue (a pending one is kept): its recovery closes
            # the dead one's runs as infra failures.
            limits = replace(limits, min_workers=1)
        decision = decide(limits, queued, workers, since, self.slots)
        self.metrics.queued.set(queued)
        for state in WorkerState:
            self.metrics.workers.labels(state.value).set(sum(w.state == state for w in workers))
        for worker_id in decision.stop:
            try:
                self.backend.stop(worker_id)
            except BackendError as exc:
                self.metrics.errors.labels("stop").inc()
                log.warning("cannot stop pending worker %s: %s", worker_id, exc)
                continue
            self.metrics.stopped.inc()
            log.info("stopped pending worker %s: %d queued HQEs, %d workers", worker_id, queued, len(workers))
        self._report(decision, queued, workers)
        if decision.start:
            record_start(self.key, now)
            try:
                worker_id = self.backend.start()
            except BackendError as exc:
                self.metrics.errors.labels("start").inc()
                log.warning("cannot start a %s worker: %s", self.backend.name, exc)
            else:
                self.metrics.started.inc()
                log.info(
                    "started %s worker %s: %d queued HQEs, %d workers before it",
                    self.backend.name,
                    worker_id,
                    queued,
                    len(workers),
                )
        return decision

    def _report(self, decision: Decision, queued: int, workers: list[Worker]) -> None:
        if decision.skip is not None:
            self.metrics.skipped.labels(decision.skip.value).inc()
        if decision.skip == self._last_skip:
            return
        self._last_skip = decision.skip
        if decision.skip is None:
            return
        pending = sum(w.state == WorkerState.PENDING for w in workers)
        log.info(
            "not starting a worker (%s): %d queued HQEs, %d workers (%d pending), min %d, max %d, %g s between starts",
            decision.skip.value,
            queued,
            len(workers),
            pending,
            self.limits.min_workers,
            self.limits.max_workers,
            self.limits.min_seconds_between_workers,
        )
