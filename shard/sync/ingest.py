"""Applies a heartbeat response to the shard's database in one transaction.

Only master-owned fields are written here; host status and HQE execution state stay the shard's.
Applying the same response twice leaves the same database, so a crash before commit loses nothing.
An ingest costs a fixed number of queries per job and host, never per HQE, so even an abort of a
large job holds the shard's lock only briefly.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import DataError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from common.constants import HQEStatus
from common.jobstatus import refresh_job_statuses
from common.models import Host, HostQueueEntry, Job, Label
from common.wire import Ack, HeartbeatResponse, HostRecord, JobRecord
from shard.models import DeadLetter, HostEvent, HostState, OutboxEntry, ShardState
from shard.services import abort_queued_hqes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    hosts: int
    removed_hosts: int
    jobs: int
    accepted: int
    rejected: int


def _labels(names: set[str]) -> dict[str, Label]:
    existing = {label.name: label for label in Label.objects.filter(name__in=names)}
    missing = names - existing.keys()
    if missing:
        Label.objects.bulk_create([Label(name=name) for name in missing], ignore_conflicts=True)
        existing = {label.name: label for label in Label.objects.filter(name__in=names)}
    return existing


def _apply_acks(acks: list[Ack]) -> tuple[int, int]:
    by_seq = {a.seq: a for a in acks}
    entries = list(OutboxEntry.objects.filter(seq__in=by_seq))
    rejected = [e for e in entries if by_seq[e.seq].result != "accepted"]
    for entry in rejected:
        log.warning("master rejected update %s of HQE %s: %s", entry.seq, entry.hqe_id, by_seq[entry.seq].error)
    DeadLetter.objects.bulk_create(
        DeadLetter(
            seq=e.seq,
            hqe_id=e.hqe_id,
            job_id=e.job_id,
            payload=e.payload,
            error=by_seq[e.seq].error or "rejected without a reason",
        )
        for e in rejected
    )
    OutboxEntry.objects.filter(id__in=[e.id for e in entries]).delete()
    return len(entries) - len(rejected), len(rejected)


def _drop_sent_events(sent: list[int], acks: list[Ack]) -> None:
    """Host events go once the master answered the heartbeat that carried them: accepted, rejected (a
    timeline entry is not worth a dead letter, only a log line) or not acknowledged at all (a master
    without timelines ignores them and never will use them)."""
    if not sent:
        return
    for ack in acks:
        if ack.result != "accepted" and ack.seq in sent:
            log.warning("master rejected host event %s: %s", ack.seq, ack.error)
    HostEvent.objects.filter(seq__in=sent).delete()


def _remove_hosts(host_ids: list[int]) -> None:
    """A removed host finishes its running job first: it is retired now and dropped once idle. One without
    a state yet gets a retired one: the master says a removal once."""
    if not host_ids:
        return
    HostState.objects.bulk_create(
        [HostState(host_id=i, retired=True) for i in Host.objects.filter(id__in=host_ids).values_list("id", flat=True)],
        update_conflicts=True,
        unique_fields=["host"],
        update_fields=["retired"],
    )


def drop_idle_retired_hosts() -> int:
    busy = HostQueueEntry.objects.filter(status__in=HQEStatus.ACTIVE, host_id__isnull=False).values("host_id")
    deleted, _ = Host.objects.filter(state__retired=True).exclude(id__in=busy).delete()
    return deleted


def retired_name(hostname: str, host_id: int) -> str:
    """The name a retired host gives up its own for: unique by its id (a name may be reused twice while
    both old hosts are busy) and within the column's 255 characters (a long name plus a suffix is not)."""
    suffix = f"~retired~{host_id}"
    return hostname[: 255 - len(suffix)] + suffix


def _one_record(what: str, action: Callable[[], None]) -> bool:
    """Applies one host or job in a savepoint: a record the database refuses (a hostname another held
    host has, an HQE id another job has) is logged and skipped, never the whole answer. The shard
    does not hold it, so the master sends it again."""
    try:
        with transaction.atomic():
            action()
    except (IntegrityError, DataError) as exc:
        log.warning("skipped %s of the master's answer: the database refused it: %s", what, exc)
        return False
    return True


def _upsert_hosts(hosts: list[HostRecord]) -> None:
    """Stores the hosts, then gives each stored one its state in one query: new, or no longer retired
    (the master assigns it again)."""
    labels = _labels({name for h in hosts for name in h.labels})
    stored = [h.id for h in hosts if _one_record(f"host {h.id} ({h.hostname})", partial(_upsert_host, h, labels))]
    if stored:
        HostState.objects.bulk_create(
            [HostState(host_id=host_id) for host_id in stored],
            update_conflicts=True,
            unique_fields=["host"],
            update_fields=["retired"],
        )


def _upsert_host(data: HostRecord, labels: dict[str, Label]) -> None:
    # A retired host may still hold the hostname that the master gave to a new host.
    for old in Host.objects.filter(hostname=data.hostname, state__retired=True).exclude(id=data.id):
        Host.objects.filter(id=old.id).update(hostname=retired_name(old.hostname, old.id))
    host, _ = Host.objects.update_or_create(
        id=data.id,
        defaults={
            "hostname": data.hostname,
            "locked": data.locked,
            "lock_reason": data.lock_reason,
            "attributes": data.attributes,
            "version": data.version,
        },
    )
    host.labels.set([labels[name] for name in data.labels])


def _upsert_jobs(jobs: list[JobRecord], suite_keyvals: dict[str, dict[str, Any]]) -> list[JobRecord]:
    """Stores the jobs; returns those stored (a job the database refuses is skipped alone)."""
    labels = _labels(
        {name for j in jobs for name in j.dependency_labels}
        | {h.meta_host for j in jobs for h in j.hqes if h.meta_host}
    )
    stored = [data for data in jobs if _one_record(f"job {data.id}", partial(_upsert_job, data, suite_keyvals, labels))]
    _close_ended_elsewhere(stored)
    return stored


def _upsert_job(data: JobRecord, suite_keyvals: dict[str, dict[str, Any]], labels: dict[str, Label]) -> None:
    job, created = Job.objects.update_or_create(
        id=data.id,
        defaults={
            "name": data.name,
            "owner": data.owner,
            "priority": data.priority,
            "command": data.command,
            "timeout_mins": data.timeout_mins,
            "max_runtime_mins": data.max_runtime_mins,
            "keyvals": data.keyvals,
            "ab": data.ab,
            "parent_id": data.parent_id,
            "suite_keyvals": suite_keyvals.get(str(data.parent_id), {}) if data.parent_id else {},
            "aborted": data.aborted,
            "version": data.version,
            "inputs": data.inputs,
            **({"created_on": data.created_on} if data.created_on else {}),
        },
    )
    job.dependency_labels.set([labels[name] for name in data.dependency_labels])
    if created:
        HostQueueEntry.objects.bulk_create(
            HostQueueEntry(
                id=h.id,
                job=job,
                host_id=h.host_id,
                meta_host=labels[h.meta_host] if h.meta_host else None,
            )
            for h in data.hqes
        )


def _close_ended_elsewhere(jobs: list[JobRecord]) -> None:
    """HQEs the master says ended (run by a database this one replaced) are never started here.

    They end with the master's status and no update: the master already has it.
    """
    ended = [(j.id, h) for j in jobs for h in j.hqes if h.status in HQEStatus.TERMINAL]
    touched: set[int] = set()
    for status in {h.status for _, h in ended}:
        ids = [h.id for _, h in ended if h.status == status]
        if HostQueueEntry.objects.filter(id__in=ids, status=HQEStatus.QUEUED).update(
            status=status, finished_on=timezone.now()
        ):
            touched |= {job_id for job_id, h in ended if h.status == status}
    refresh_job_statuses(touched)


@transaction.atomic
def apply_response(response: HeartbeatResponse, sent_events: list[int] | None = None) -> IngestResult:
    """`sent_events`: the seqs of the host events the heartbeat carried."""
    # One response at a time, even from two processes on one shard database.
    ShardState.objects.get_or_create(id=1)
    ShardState.objects.select_for_update().get(id=1)
    accepted, rejected = _apply_acks(response.acks)
    _drop_sent_events(sent_events or [], response.acks)
    _remove_hosts(response.removed_host_ids)
    _upsert_hosts(response.hosts)
    stored = _upsert_jobs(response.jobs, response.suite_keyvals)
    abort_queued_hqes([j.id for j in stored if j.aborted])
    drop_idle_retired_hosts()
    ShardState.objects.filter(id=1).update(last_heartbeat_ok=timezone.now())
    return IngestResult(
        hosts=len(response.hosts),
        removed_hosts=len(response.removed_host_ids),
        jobs=len(response.jobs),
        accepted=accepted,
        rejected=rejected,
    )


def known_jobs() -> list[dict[str, int]]:
    """Jobs whose HQEs still run here or whose final updates the master has not acked yet."""
    unfinished = Q(hqes__status__in=HQEStatus.ACTIVE) | Q(id__in=OutboxEntry.objects.values("job_id"))
    rows = Job.objects.filter(unfinished).distinct().order_by("id").values_list("id", "version")
    return [{"id": i, "version": v} for i, v in rows]


def known_hosts() -> list[dict[str, Any]]:
    rows = Host.objects.order_by("id").values_list("id", "version", "status")
    return [{"id": i, "version": v, "status": s} for i, v, s in rows]
