"""The master's purge: finished jobs older than a cutoff with their HQEs and intervals, old host
intervals and audit records, and (only when asked) old benchmark results. `manage.py purge` runs it.

A job is old when it was created before the cutoff, is no longer active and none of its HQEs ended
after the cutoff, nor has results that may still be on their way: an HQE's results are settled once
its shard has been heard from RESULTS_SETTLE after the HQE ended (a shard in contact uploads, or
quarantines after its bounded tries, within minutes), or once the HQE ended longer ago than the
shards' upload horizon (FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS: no shard looks that far back), or when
its shard is deleted. Until then the job stays, so the shard never finds its HQE gone and quarantines
its results as "unknown HQE". Benchmark results outlive their jobs (a run only loses its link to the job and
HQE); with `results`, runs stored before the cutoff go too, with their entries (regressions stay,
without their run). Notification deliveries delivered or given up before the cutoff go, and then the
outbox events (fanned out before the cutoff) left with none; a pending delivery, and its event, stay.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from common.constants import HQEStatus, JobStatus
from common.models import HostQueueEntry, Job
from common.purge import BatchHook, PurgeReport, purge_in_batches
from master.access import audit
from master.blobs.store import purge_blobs
from master.models import AuditRecord, AuditTarget
from master.notify.models import Delivery, DeliveryStatus, NotificationEvent
from master.results.models import TestEntry, TestRun
from master.timeline.models import Interval

# How long a shard in contact takes at most to upload (or quarantine) an ended run's results: its
# uploader passes every heartbeat interval and gives a record up after a bounded number of tries.
RESULTS_SETTLE = timedelta(hours=1)


def results_in_flight() -> QuerySet[HostQueueEntry]:
    """Ended HQEs whose results may still come: their shard has not been heard from RESULTS_SETTLE
    after they ended, and they ended within the upload horizon."""
    horizon = timezone.now() - timedelta(days=settings.FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS)
    return HostQueueEntry.objects.filter(finished_on__gte=horizon, job__shard__isnull=False).filter(
        Q(job__shard__last_heartbeat__isnull=True) | Q(job__shard__last_heartbeat__lt=F("finished_on") + RESULTS_SETTLE)
    )


def old_jobs(cutoff: datetime) -> QuerySet[Job]:
    return (
        Job.objects.filter(created_on__lt=cutoff)
        .exclude(status__in=JobStatus.ACTIVE)
        .exclude(hqes__status__in=HQEStatus.ACTIVE)
        .exclude(hqes__finished_on__gte=cutoff)
        .exclude(id__in=results_in_flight().values("job_id"))
        # A suite's children still running read their parent's keyvals (the heartbeat's suite_keyvals),
        # and a child kept keeps its link: the parent goes with (or after) its last child.
        .exclude(children__status__in=JobStatus.ACTIVE)
        .exclude(children__created_on__gte=cutoff)
        .exclude(children__hqes__finished_on__gte=cutoff)
    )


def old_host_intervals(cutoff: datetime) -> QuerySet[Interval]:
    """Cleaning, repair and Repair Failed stretches (no job) that ended before the cutoff."""
    return Interval.objects.filter(job__isnull=True, end__lt=cutoff)


def old_deliveries(cutoff: datetime) -> QuerySet[Delivery]:
    """Notification deliveries that ended (delivered, or given up) before the cutoff."""
    ended = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED)
    return Delivery.objects.filter(status__in=ended, finished_on__lt=cutoff)


def old_events(cutoff: datetime) -> QuerySet[NotificationEvent]:
    """Outbox events from before the cutoff, fanned out, with no delivery left."""
    return NotificationEvent.objects.filter(created_on__lt=cutoff, fanned_out=True, deliveries__isnull=True)


def _job_rows(jobs: QuerySet[Job]) -> dict[str, int]:
    return {
        "jobs": jobs.count(),
        "HQEs": HostQueueEntry.objects.filter(job__in=jobs).count(),
        "job intervals": Interval.objects.filter(job__in=jobs).count(),
    }


@transaction.atomic
def delete_jobs(ids: list[int], cutoff: datetime) -> dict[str, int]:
    """One batch: the jobs among `ids` still old and finished, their HQEs and intervals. Their
    benchmark results stay (unlinked); `--results` removes results by their own age."""
    # Their HQEs locked first: an upload or log append holding one (master.services.hqe_guard) finishes, and
    # what it wrote is deleted or unlinked with it, rather than failing this batch at commit.
    list(HostQueueEntry.objects.select_for_update().filter(job_id__in=ids).order_by("id").values_list("id"))
    ids = list(old_jobs(cutoff).filter(id__in=ids).values_list("id", flat=True))
    intervals = Interval.objects.filter(job_id__in=ids).delete()[0]
    _, by_model = Job.objects.filter(id__in=ids).delete()
    return {
        "jobs": by_model.get(Job._meta.label, 0),
        "HQEs": by_model.get(HostQueueEntry._meta.label, 0),
        "job intervals": intervals,
    }


@transaction.atomic
def delete_host_intervals(ids: list[int], cutoff: datetime) -> dict[str, int]:
    return {"host intervals": old_host_intervals(cutoff).filter(id__in=ids).delete()[0]}


@transaction.atomic
def delete_deliveries(ids: list[int], cutoff: datetime) -> dict[str, int]:
    return {"notification deliveries": old_deliveries(cutoff).filter(id__in=ids).delete()[0]}


@transaction.atomic
def delete_events(ids: list[int], cutoff: datetime) -> dict[str, int]:
    return {"notification events": old_events(cutoff).filter(id__in=ids).delete()[0]}


@transaction.atomic
def delete_audit(ids: list[int], cutoff: datetime) -> dict[str, int]:
    _, by_model = AuditRecord.objects.filter(id__in=ids, at__lt=cutoff).delete()
    return {
        "audit records": by_model.get(AuditRecord._meta.label, 0),
        "audit targets": by_model.get(AuditTarget._meta.label, 0),
    }


@transaction.atomic
def delete_results(ids: list[int], cutoff: datetime) -> dict[str, int]:
    _, by_model = TestRun.objects.filter(id__in=ids, created_on__lt=cutoff).delete()
    return {"results": by_model.get(TestRun._meta.label, 0), "result entries": by_model.get(TestEntry._meta.label, 0)}


def purge(
    cutoff: datetime,
    *,
    results: bool = False,
    dry_run: bool = False,
    batch_size: int,
    on_batch: BatchHook | None = None,
) -> PurgeReport:
    """Deletes (or counts, on a dry run) the master's history older than `cutoff`, batch by batch;
    a real purge ends with one audit record of what it deleted."""
    report = PurgeReport(dry_run=dry_run)
    purge_in_batches(
        report,
        "jobs",
        lambda: old_jobs(cutoff),
        lambda ids: delete_jobs(ids, cutoff),
        lambda: _job_rows(old_jobs(cutoff)),
        batch_size=batch_size,
        on_batch=on_batch,
    )
    purge_in_batches(
        report,
        "host intervals",
        lambda: old_host_intervals(cutoff),
        lambda ids: delete_host_intervals(ids, cutoff),
        lambda: {"host intervals": old_host_intervals(cutoff).count()},
        batch_size=batch_size,
        on_batch=on_batch,
    )
    purge_in_batches(
        report,
        "notification deliveries",
        lambda: old_deliveries(cutoff),
        lambda ids: delete_deliveries(ids, cutoff),
        lambda: {"notification deliveries": old_deliveries(cutoff).count()},
        batch_size=batch_size,
        on_batch=on_batch,
    )
    # Counted as they would be once those deliveries are gone (a dry run deletes none).
    deliveries_left = Delivery.objects.exclude(id__in=old_deliveries(cutoff).values("id"))
    purge_in_batches(
        report,
        "notification events",
        lambda: old_events(cutoff),
        lambda ids: delete_events(ids, cutoff),
        lambda: {
            "notification events": NotificationEvent.objects.filter(created_on__lt=cutoff, fanned_out=True)
            .exclude(id__in=deliveries_left.values("event_id"))
            .count()
        },
        batch_size=batch_size,
        on_batch=on_batch,
    )
    if results:
        old_runs = TestRun.objects.filter(created_on__lt=cutoff)
        purge_in_batches(
            report,
            "results",
            lambda: old_runs,
            lambda ids: delete_results(ids, cutoff),
            lambda: {"results": old_runs.count(), "result entries": TestEntry.objects.filter(run__in=old_runs).count()},
            batch_size=batch_size,
            on_batch=on_batch,
        )
    old_audit = AuditRecord.objects.filter(at__lt=cutoff)
    purge_in_batches(
        report,
        "audit records",
        lambda: old_audit,
        lambda ids: delete_audit(ids, cutoff),
        lambda: {
            "audit records": old_audit.count(),
            "audit targets": AuditTarget.objects.filter(record__in=old_audit).count(),
        },
        batch_size=batch_size,
        on_batch=on_batch,
    )
    # Blobs go by their own retention, once no job (among those left) nor output names them.
    blobs = purge_blobs(float(settings.FLEETSHARD_BLOB_RETENTION_DAYS), dry_run=dry_run)
    if blobs:
        report.deleted["blobs"] += blobs
    if not dry_run:
        with transaction.atomic():
            audit.record(
                "database.purge",
                acting_user=None,
                details={"older_than": cutoff.isoformat(), "results": results, "deleted": dict(report.deleted)},
            )
    return report
