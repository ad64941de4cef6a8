"""Writing events to the outbox, inside the transaction that causes them (docs/notifications.md).

Each function is the one call a cause makes: the heartbeat (`jobs_ended`, `host_statuses`), host
discovery (`host_missing`, when a host's status becomes Missing), the regression detector
(`regression_confirmed`, `regression_fixed`) and the sender's own look for silent shards
(`shard_offline`). Each costs no query when there is nothing to say, and one INSERT (plus one read of
what the event names) when there is.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from common.constants import JobStatus
from common.models import Host, HostQueueEntry, Job, Shard
from master.notify.models import EVENTS, NotificationEvent

REPAIR_FAILED = "Repair Failed"
MISSING = "Missing"


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any]
    labels: list[str] = field(default_factory=list)
    owner: str = ""


def emit(events: Iterable[Event], now: datetime | None = None) -> None:
    """Writes `events` to the outbox in one INSERT, inside the caller's transaction."""
    rows = []
    now = now or timezone.now()
    for event in events:
        if event.kind not in EVENTS:
            raise ValueError(f"unknown notification event {event.kind!r}")
        rows.append(
            NotificationEvent(
                kind=event.kind, labels=sorted(set(event.labels)), owner=event.owner, data=event.data, created_on=now
            )
        )
    if rows:
        NotificationEvent.objects.bulk_create(rows)


def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when is not None else None


def _host_events(kind: str, host_ids: Iterable[int], status: str) -> list[Event]:
    ids = set(host_ids)
    if not ids:
        return []
    labels: dict[int, list[str]] = defaultdict(list)
    for host_id, name in Host.labels.through.objects.filter(host_id__in=ids).values_list("host_id", "label__name"):
        labels[host_id].append(name)
    hosts = Host.objects.filter(id__in=ids).values_list("id", "hostname", "shard__hostname", "locked")
    return [
        Event(
            kind,
            {
                "host": hostname,
                "id": host_id,
                "status": status,
                "shard": shard,
                "locked": locked,
                "labels": sorted(labels[host_id]),
            },
            labels[host_id],
        )
        for host_id, hostname, shard, locked in sorted(hosts)
    ]


def host_statuses(changes: Iterable[tuple[int, str, str]]) -> None:
    """Host status changes (id, old status, new status) as the heartbeat stores them: a host that
    becomes `Repair Failed` is `host.repair_failed`, one that becomes `Missing` is `host.missing`."""
    failed, missing = [], []
    for host_id, old, new in changes:
        if new == old:
            continue
        if new == REPAIR_FAILED:
            failed.append(host_id)
        elif new == MISSING:
            missing.append(host_id)
    emit([*_host_events("host.repair_failed", failed, REPAIR_FAILED), *_host_events("host.missing", missing, MISSING)])


def host_missing(host_ids: Iterable[int]) -> None:
    """The hook for host discovery: call it in the transaction that sets these hosts' status to
    Missing (only for hosts whose status was something else)."""
    emit(_host_events("host.missing", host_ids, MISSING))


def jobs_ended(job_ids: Iterable[int]) -> None:
    """`job.ended` for each of `job_ids` whose status is now terminal, about its dependency and meta-host
    labels. Call it after the job statuses
    were refreshed, with the jobs one of whose HQEs became terminal in this transaction: a job's last
    HQE ends once, so its event is written once."""
    ids = set(job_ids)
    if not ids:
        return
    jobs = list(
        Job.objects.filter(id__in=ids)
        .exclude(status__in=JobStatus.ACTIVE)
        .values_list("id", "name", "owner", "status", "shard__hostname", "created_on")
    )
    if not jobs:
        return
    labels: dict[int, list[str]] = defaultdict(list)
    ended = [j[0] for j in jobs]
    for job_id, name in Job.dependency_labels.through.objects.filter(job_id__in=ended).values_list(
        "job_id", "label__name"
    ):
        labels[job_id].append(name)
    meta = HostQueueEntry.objects.filter(job_id__in=ended, meta_host__isnull=False)
    for job_id, name in meta.values_list("job_id", "meta_host__name").distinct():
        if name not in labels[job_id]:
            labels[job_id].append(name)
    emit(
        Event(
            "job.ended",
            {
                "job": job_id,
                "name": name,
                "owner": owner,
                "status": status,
                "shard": shard,
                "created_on": _iso(created),
                "labels": sorted(labels[job_id]),
            },
            labels[job_id],
            owner,
        )
        for job_id, name, owner, status, shard, created in sorted(jobs)
    )


def shard_offline(shard: Shard, silent_s: float, now: datetime) -> None:
    emit(
        [
            Event(
                "shard.offline",
                {
                    "shard": shard.hostname,
                    "last_heartbeat": _iso(shard.last_heartbeat),
                    "silent_s": round(silent_s, 1),
                    "labels": sorted(label.name for label in shard.labels.all()),
                },
                [label.name for label in shard.labels.all()],
            )
        ],
        now,
    )


def _regression_data(reg: Any) -> dict[str, Any]:
    return {
        "regression": reg.id,
        "test": reg.test,
        "entry": reg.entry,
        "label": reg.label,
        "start": _iso(reg.start),
        "before_s": reg.before_s,
        "after_s": reg.after_s,
        "change_pct": round(reg.change_pct, 3),
        "status": reg.status,
        "detected_on": _iso(reg.detected_on),
        "fixed_on": _iso(reg.fixed_on),
        "run": reg.run_id,
    }


def _run_owner(reg: Any) -> str:
    if reg.run_id is None:
        return ""
    from master.results.models import TestRun

    owner = TestRun.objects.filter(id=reg.run_id).values_list("job__owner", flat=True).first()
    return owner or ""


def regression_confirmed(reg: Any, now: datetime) -> None:
    """`regression.new`: the detector confirmed the regression (master.results.regressions)."""
    emit([Event("regression.new", _regression_data(reg), [reg.label] if reg.label else [], _run_owner(reg))], now)


def regression_fixed(reg: Any, now: datetime) -> None:
    """`regression.fixed`, for a regression whose `regression.new` was sent."""
    emit([Event("regression.fixed", _regression_data(reg), [reg.label] if reg.label else [], _run_owner(reg))], now)
